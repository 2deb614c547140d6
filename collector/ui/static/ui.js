// agentfunnel UI: the little that needs script. Served from this package (script-src 'self'), no framework.
// 1. A link to a tool call, span or stage (#call-…) opens its <details>, also when the page opens with it.
// 2. While a session is open (body data-live="1"), the page re-reads itself every few seconds and swaps in
//    the new main content, keeping what is open and where the reader is; it stops once the session closes.
(function () {
  "use strict";
  function openTarget() {
    var id = decodeURIComponent(location.hash.slice(1));
    if (!id) return;
    var el = document.getElementById(id);
    if (!el) return;
    var details = el.tagName === "DETAILS" ? el : el.querySelector("details");
    if (details) details.open = true;
    for (var p = el.parentElement; p; p = p.parentElement) if (p.tagName === "DETAILS") p.open = true;
  }
  window.addEventListener("hashchange", openTarget);
  document.addEventListener("DOMContentLoaded", openTarget);

  var LIVE_MS = 3000;
  function refresh() {
    if (document.body.getAttribute("data-live") !== "1") return;
    if (document.hidden) { setTimeout(refresh, LIVE_MS); return; }
    fetch(location.pathname + location.search, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("main"), main = document.getElementById("main");
        if (!fresh || !main) return;
        var opened = Array.prototype.map.call(main.querySelectorAll("details[open][id], [id] > details[open]"),
          function (d) { return d.id || d.parentElement.id; });
        var y = window.scrollY;
        main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes).map(function (n) {
          return document.importNode(n, true); }));
        opened.forEach(function (id) {
          var el = document.getElementById(id);
          var d = el && (el.tagName === "DETAILS" ? el : el.querySelector("details"));
          if (d) d.open = true;
        });
        window.scrollTo(0, y);
        document.body.setAttribute("data-live", doc.body.getAttribute("data-live") || "0");
        if (document.body.getAttribute("data-live") !== "1") {
          var status = document.getElementById("live-status");
          if (status) status.textContent = status.getAttribute("data-closed") || "";
        }
      })
      .catch(function () { /* try again on the next tick */ })
      .then(function () { setTimeout(refresh, LIVE_MS); });
  }
  document.addEventListener("DOMContentLoaded", function () { setTimeout(refresh, LIVE_MS); });
})();
