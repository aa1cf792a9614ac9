// Live stock for the storefront: the product page polls its product's JSON each second, the home
// page the list of products it shows (/api/products), and each updates the stock bar, the sale
// badge, the countdown, the name, the price, the product page's buy button, limit and quantities,
// and the home page card's link ("Buy now" while live, "View" otherwise). The home page's cards
// follow the list: a product listed since the page loaded gets a card, one unlisted or deleted
// loses its own.
// Without JavaScript the pages still work; they just show the stock as it was when loaded.
(function () {
  "use strict";
  if (!window.fetch) return;
  var STATE_LABELS = { upcoming: "Starts soon", live: "Live now", sold_out: "Sold out", ended: "Sale ended" };
  var BUTTON_LABELS = { upcoming: "Not on sale yet", live: "Buy now", sold_out: "Sold out", ended: "Sale ended" };
  var ANNOUNCE = { live: "The sale is live.", sold_out: "Sold out.", ended: "The sale has ended." };
  var POLL_MS = 1000;

  function pad(n) { return n < 10 ? "0" + n : String(n); }
  function duration(seconds) {
    seconds = Math.max(0, Math.ceil(seconds));
    var d = Math.floor(seconds / 86400), h = Math.floor(seconds / 3600) % 24;
    var m = Math.floor(seconds / 60) % 60, s = seconds % 60;
    return (d ? d + "d " : "") + (d || h ? pad(h) + ":" : "") + pad(m) + ":" + pad(s);
  }

  // The buy form's quantity as the product page renders it for a limit of ``most``: a choice of
  // 1..most, or a fixed 1; the shopper's choice is kept while it is still allowed.
  function offer(quantity, most) {
    var chosen = quantity.querySelector("select");
    var keep = chosen ? Math.min(Number(chosen.value), most) : 1;
    quantity.setAttribute("data-most", String(most));
    if (most <= 1) {
      var fixed = document.createElement("input");
      fixed.type = "hidden"; fixed.name = "quantity"; fixed.value = "1";
      quantity.replaceChildren(fixed);
      return;
    }
    var label = document.createElement("label");
    label.htmlFor = "quantity"; label.textContent = "Quantity";
    var select = document.createElement("select");
    select.id = "quantity"; select.name = "quantity";
    select.setAttribute("aria-describedby", "limit-note");
    for (var n = 1; n <= most; n++) select.add(new Option(String(n), String(n)));
    select.value = String(keep);
    quantity.replaceChildren(label, select);
  }

  function LiveProduct(el) {
    this.el = el;
    this.url = el.getAttribute("data-api");
    this.state = el.getAttribute("data-state");
    this.part = function (role) { return el.querySelector('[data-role="' + role + '"]'); };
    var cd = this.part("countdown");
    var now = performance.now();
    this.startsAt = cd && cd.hasAttribute("data-starts-in") ? now + 1000 * Number(cd.getAttribute("data-starts-in")) : null;
    this.endsAt = cd && cd.hasAttribute("data-ends-in") ? now + 1000 * Number(cd.getAttribute("data-ends-in")) : null;
  }

  LiveProduct.prototype.tick = function () {
    var cd = this.part("countdown");
    if (!cd) return;
    var now = performance.now();
    if (this.state === "upcoming" && this.startsAt !== null) {
      cd.textContent = "Starts in " + duration((this.startsAt - now) / 1000);
    } else if (this.state === "live" && this.endsAt !== null) {
      cd.textContent = "Ends in " + duration((this.endsAt - now) / 1000);
    } else if (this.state !== "upcoming" && this.state !== "live") {
      cd.textContent = "";
    }
  };

  LiveProduct.prototype.render = function (p) {
    var now = performance.now();
    this.startsAt = p.starts_in_s === null ? null : now + 1000 * p.starts_in_s;
    this.endsAt = p.ends_in_s === null ? null : now + 1000 * p.ends_in_s;
    this.part("stock").textContent = p.stock;
    this.part("initial").textContent = p.initial_stock;
    var bar = this.part("bar");
    var percent = p.initial_stock ? Math.round(100 * p.stock / p.initial_stock) : 0;
    bar.setAttribute("aria-valuenow", p.stock);
    bar.setAttribute("aria-valuemax", p.initial_stock);
    bar.setAttribute("aria-valuetext", p.stock + " of " + p.initial_stock + " left");
    bar.classList.toggle("is-empty", p.stock === 0);
    bar.classList.toggle("is-low", p.stock > 0 && p.stock <= 10);
    bar.firstElementChild.style.width = percent + "%";

    if (p.state !== this.state) {
      this.el.classList.remove("state-" + this.state);
      this.el.classList.add("state-" + p.state);
      this.el.setAttribute("data-state", p.state);
      var badge = this.part("state");
      badge.className = "badge badge-" + p.state;
      badge.textContent = STATE_LABELS[p.state] || p.state;
      var announce = this.part("announce");
      if (announce && ANNOUNCE[p.state]) announce.textContent = ANNOUNCE[p.state];
      this.state = p.state;
    }
    var name = this.part("name");
    if (name && name.textContent !== p.name) {
      // A rename by staff: the heading (or the card's title), the initial and, on the product page,
      // the breadcrumb and the window's title. Text only: a name is never parsed as markup.
      var was = name.textContent;
      name.textContent = p.name;
      var letter = this.part("initial-letter");
      if (letter) letter.textContent = p.name.charAt(0).toUpperCase();
      if (name.tagName === "H1") {
        var crumb = document.querySelector("[data-name]");
        if (crumb) crumb.textContent = p.name;
        if (document.title.indexOf(was) === 0) document.title = p.name + document.title.slice(was.length);
      }
    }
    var price = this.part("price");
    if (price && price.textContent !== "$" + p.price) price.textContent = "$" + p.price;
    var limit = this.part("limit");
    if (limit) limit.textContent = "Limit " + p.per_customer_limit + " per shopper.";
    var quantity = this.part("quantity");
    if (quantity && quantity.getAttribute("data-most") !== String(p.max_quantity)) offer(quantity, p.max_quantity);
    var button = this.part("buy");
    if (button) {
      button.disabled = p.state !== "live";
      button.textContent = BUTTON_LABELS[p.state] || "Buy now";
    }
    var card = this.part("card-button");  // the home page's link to the product: "Buy now" while live, else "View"
    if (card) {
      var live = p.state === "live";
      card.textContent = live ? "Buy now" : "View";
      card.setAttribute("aria-label", (live ? "Buy " : "View ") + p.name);
      card.classList.toggle("button-quiet", !live);
    }
    this.tick();
  };

  // The product is no longer in the sale (deleted, or its sku renamed: its URLs answer 404): the
  // product page offers nothing to buy and says so. Its polling stops. (A home card goes when the
  // list no longer has it: Catalogue.sync.)
  LiveProduct.prototype.gone = function () {
    this.state = "gone";
    var badge = this.part("state");
    badge.className = "badge badge-ended";
    badge.textContent = "No longer on sale";
    var cd = this.part("countdown");
    if (cd) cd.textContent = "";
    var button = this.part("buy");
    if (button) { button.disabled = true; button.textContent = "Not on sale"; }
    var announce = this.part("announce");
    if (announce) announce.textContent = "This product is no longer on sale.";
  };

  LiveProduct.prototype.poll = function () {
    var self = this;
    if (self.state === "gone") return;
    if (document.hidden) { setTimeout(function () { self.poll(); }, POLL_MS); return; }
    fetch(this.url, { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (r) {
        if (r.status === 404) { self.gone(); return null; }
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (p) { if (p) self.render(p); })
      .catch(function () { /* a missed poll is retried in a second */ })
      .then(function () { if (self.state !== "gone") setTimeout(function () { self.poll(); }, POLL_MS); });
  };

  // The home page's cards, kept to the products the server lists now, in its order.
  function Catalogue(list) {
    var self = this;
    this.list = list;
    this.url = list.getAttribute("data-catalogue");
    this.template = document.getElementById("card-template");
    this.empty = list.querySelector(".empty");
    this.cards = {};
    Array.prototype.forEach.call(list.querySelectorAll("[data-live-sku]"), function (el) {
      self.cards[el.getAttribute("data-live-sku")] = new LiveProduct(el);
    });
  }

  // A card for a product listed since the page loaded: the template's, its text and links set
  // (never parsed as markup); render() fills in the rest.
  Catalogue.prototype.card = function (p) {
    var el = this.template.content.firstElementChild.cloneNode(true);
    el.setAttribute("data-live-sku", p.sku);
    el.setAttribute("data-api", p.api);
    el.querySelector('[data-role="initial-letter"]').classList.add("art-" + p.art);
    el.querySelector('[data-role="name"]').href = p.url;
    el.querySelector('[data-role="card-button"]').href = p.url;
    return new LiveProduct(el);  // render() sets the name, the initial, the labels and the figures
  };

  Catalogue.prototype.sync = function (products) {
    var self = this, seen = {};
    products.forEach(function (p) { seen[p.sku] = true; });
    Object.keys(this.cards).forEach(function (sku) {
      if (seen[sku]) return;
      self.cards[sku].state = "gone";
      self.cards[sku].el.remove();
      delete self.cards[sku];
    });
    // In the server's order; a card already in its place is not moved (a focused link keeps its focus).
    var at = this.list.firstElementChild;
    products.forEach(function (p) {
      var card = self.cards[p.sku] || (self.cards[p.sku] = self.card(p));
      if (card.el === at) at = at.nextElementSibling;
      else self.list.insertBefore(card.el, at);
      card.render(p);
    });
    if (this.empty) this.empty.hidden = products.length > 0;
  };

  Catalogue.prototype.tick = function () {
    var cards = this.cards;
    Object.keys(cards).forEach(function (sku) { cards[sku].tick(); });
  };

  Catalogue.prototype.poll = function () {
    var self = this;
    if (document.hidden) { setTimeout(function () { self.poll(); }, POLL_MS); return; }
    fetch(this.url, { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (answer) { self.sync(answer.products); })
      .catch(function () { /* a missed poll is retried in a second */ })
      .then(function () { setTimeout(function () { self.poll(); }, POLL_MS); });
  };

  var list = document.querySelector("[data-catalogue]");
  var live = list ? [new Catalogue(list)] : Array.prototype.map.call(
    document.querySelectorAll("[data-live-sku]"), function (el) { return new LiveProduct(el); }
  );
  live.forEach(function (p) { p.tick(); p.poll(); });
  setInterval(function () { live.forEach(function (p) { p.tick(); }); }, 1000);
})();
