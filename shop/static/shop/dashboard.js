// The admin dashboard's live stock: poll the staff JSON endpoint each second and update the rows
// (a row for a product added since the page was rendered, none for one deleted).
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

  var tbody = root.querySelector("#live-stock tbody");
  var ordersUrl = root.getAttribute("data-orders-url");
  var NUMBERS = ["stock", "initial_stock", "sold", "ordered", "fence"];

  function cell(tag, className) {
    var el = document.createElement(tag);
    if (className) el.className = className;
    return el;
  }

  // A row as the page renders it (admin/inventory/dashboard.html), for a product added since.
  function newRow(p) {
    var row = cell("tr");
    row.setAttribute("data-sku", p.sku);
    var head = cell("th");
    head.scope = "row";
    var link = cell(ordersUrl ? "a" : "span");  // a link to the product's orders for staff who may view them
    link.setAttribute("data-field", "name");
    var code = cell("code");
    code.textContent = p.sku;
    head.append(link, " ", code);
    var badge = cell("span", "sale-badge");
    badge.setAttribute("data-field", "state");
    var barCell = cell("td", "bar-col");
    var bar = cell("div", "dash-bar");
    bar.setAttribute("role", "progressbar");
    bar.setAttribute("aria-valuemin", "0");
    bar.appendChild(cell("div", "dash-bar-fill"));
    barCell.appendChild(bar);
    var sale = cell("td");
    sale.appendChild(badge);
    row.append(head, sale, barCell);
    NUMBERS.forEach(function (f) {
      var td = cell("td", "num");
      td.setAttribute("data-field", f);
      row.appendChild(td);
    });
    var invariant = cell("td");
    invariant.setAttribute("data-field", "invariant");
    row.appendChild(invariant);
    return row;
  }

  // The rows of the products as they are now, in the server's order: a product added since the
  // page was rendered gets a row, a deleted one loses its own; the "no products" row when none.
  function rowsFor(products) {
    var rows = {};
    Array.prototype.forEach.call(tbody.querySelectorAll("tr"), function (row) {
      var sku = row.getAttribute("data-sku");
      if (sku !== null) rows[sku] = row;
      else if (products.length) row.remove();
    });
    var seen = {};
    var ordered = products.map(function (p) {
      seen[p.sku] = true;
      var row = rows[p.sku] || newRow(p);
      tbody.appendChild(row);
      return row;
    });
    Object.keys(rows).forEach(function (sku) { if (!seen[sku]) rows[sku].remove(); });
    if (!products.length && !tbody.querySelector("tr")) {
      var empty = cell("tr"), td = cell("td");
      td.colSpan = 9;
      td.textContent = "No products yet. Run python manage.py seed.";
      empty.appendChild(td);
      tbody.appendChild(empty);
    }
    return ordered;
  }

  // The server judges the invariant (inventory.services.AuditReport); this page only shows its verdict.
  function render(products, totals) {
    var rows = rowsFor(products);
    products.forEach(function (p, i) {
      var row = rows[i];
      var link = row.querySelector('[data-field="name"]');
      if (link.textContent !== p.name) link.textContent = p.name;
      if (ordersUrl) link.href = ordersUrl + "?product__id__exact=" + p.id;
      NUMBERS.forEach(function (f) { set(row, f, p[f]); });
      var badge = row.querySelector('[data-field="state"]');
      badge.className = "sale-badge sale-" + p.state;
      badge.textContent = p.state_label;
      var bar = row.querySelector(".dash-bar");
      bar.setAttribute("aria-label", p.name + " stock left");
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
