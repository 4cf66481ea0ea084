// The console's one script beside htmx. The Content-Security-Policy allows no inline
// script, event handler or style attribute, so what they did is done here: bars take
// their width, and markers their place, from data-width and data-left (a script may
// set a style property), and a copy button copies its data-copy.
(function () {
  function place(root) {
    var all = [root].concat(Array.prototype.slice.call(root.querySelectorAll("[data-width], [data-left]")));
    all.forEach(function (el) {
      if (!el.dataset) return;
      if (el.dataset.width !== undefined) el.style.width = el.dataset.width + "%";
      if (el.dataset.left !== undefined) el.style.left = el.dataset.left + "%";
    });
  }
  htmx.onLoad(place);
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-copy]");
    if (button && navigator.clipboard) navigator.clipboard.writeText(button.dataset.copy);
  });
})();
