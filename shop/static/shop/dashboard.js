// The admin dashboard's live stock: poll the staff JSON endpoint each second and update the rows.
(function () {
  "use strict";
  var root = document.querySelector("[data-stock-url]");
  if (!root || !window.fetch) return;
  var url = root.getAttribute("data-stock-url");
  var heading = document.getElementById("live-stock-heading");
  var note = document.getElementById("live-note");

  function set(row, field, value) {
    var cell = row.querySelector('[data-field="' + field + '"]');
    if (cell && cell.textContent !== String(value)) cell.textContent = value;
  }

  // The server judges the invariant (inventory.services.AuditReport); this page only shows its verdict.
  function render(products, totals) {
    products.forEach(function (p) {
      var row = root.querySelector('tr[data-sku="' + p.sku + '"]');
      if (!row) return;
      ["stock", "initial_stock", "sold", "ordered", "fence"].forEach(function (f) { set(row, f, p[f]); });
      var badge = row.querySelector('[data-field="state"]');
      badge.className = "sale-badge sale-" + p.state;
      badge.textContent = p.state_label;
      var bar = row.querySelector(".dash-bar");
      bar.setAttribute("aria-valuenow", p.stock);
      bar.setAttribute("aria-valuemax", p.initial_stock);
      bar.firstElementChild.style.width = p.percent_left + "%";
      var mark = document.createElement("span");
      mark.className = "invariant " + (p.invariant_ok ? "invariant-ok" : "invariant-broken");
      mark.textContent = p.invariant_ok ? "✔ holds" : "✘ broken";
      mark.title = p.problems.join("; ");
      row.querySelector('[data-field="invariant"]').replaceChildren(mark);
    });
    document.getElementById("total-stock").textContent = totals.stock;
    document.getElementById("total-orders").textContent = totals.orders;
    var tile = document.getElementById("invariant-tile");
    tile.className = "tile " + (totals.invariant_ok ? "tile-ok" : "tile-bad");
    document.getElementById("invariant-summary").textContent = totals.invariant_ok ? "✔ holds" : "✘ broken";
  }

  function poll() {
    if (document.hidden) return setTimeout(poll, 1000);
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) {
        render(data.products, data.totals);
        heading.classList.remove("live-stale");
        note.textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function () { heading.classList.add("live-stale"); note.textContent = "connection lost, retrying"; })
      .then(function () { setTimeout(poll, 1000); });
  }
  setTimeout(poll, 1000);
})();
