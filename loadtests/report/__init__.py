"""The burst report: one self-contained HTML file that says, per strategy, what a run showed.

:func:`render_report` turns the burst JSON (``manage.py flashsale --json``; its fields
in ``docs/burst.md``) into a page with the side-by-side table, the machine and the command, and per
strategy its stock over time, latency histogram, throughput against the floor, server-side
split and one sentence computed from its figures. :func:`write_report` writes it.

What holds for the page:

- it loads nothing: styles are inline, charts are inline SVG, there is no script, and no font
  or image is fetched (the admin dashboard shows the sentences stored with each ``BurstRun``,
  not read back from the page);
- every string taken from the JSON is HTML-escaped, in text and in attributes: the page is
  Django templates (``templates/report/``) with autoescaping, and the SVG charts escape what
  they draw;
- a missing key is shown as "–" (older runs and rows that do not exist yet lack keys); only a
  document without a list of runs, a run that is not an object, or a run without a "row" name
  is refused, with :class:`ReportError`.

The machine block is the JSON's ``machine``, shown as recorded. :func:`machine_info` measures this
machine (it needs Django's database connection and the shop's Redis settings) and
:func:`complete_machine` fills in what a recorded block lacks; ``manage.py report`` does that
before rendering.

The parts live in modules of this package; import each name from its module: ``base`` (paths, the
error, reading figures), ``sentences`` (the sentence, phases, durability), ``machine``,
``views`` (one view per run), ``charts`` (the figures), ``page`` (the templates' context, rendering
and writing a report) and ``svg`` (the drawing primitives).
"""
