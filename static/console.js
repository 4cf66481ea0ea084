// The console's one script beside htmx. The Content-Security-Policy allows no inline
// script, event handler or style attribute, so what they did is done here: bars take
// their width, and markers their place, from data-width and data-left (a script may
// set a style property), and a copy button copies its data-copy. A table cell too
// narrow for its text gets the whole text on hover (title), unless it says more there.
(function () {
  function titled(root) {
    var cells = Array.prototype.slice.call(root.querySelectorAll ? root.querySelectorAll("td, th") : []);
    if (root.matches && root.matches("td, th")) cells.push(root);
    cells.forEach(function (cell) {
      var own = cell.hasAttribute("title") && !cell.hasAttribute("data-cut");
      if (own) return;
      if (cell.scrollWidth > cell.clientWidth + 1) {
        cell.title = cell.textContent.replace(/\s+/g, " ").trim();
        cell.setAttribute("data-cut", "");
      } else if (cell.hasAttribute("data-cut")) {
        cell.removeAttribute("title");
        cell.removeAttribute("data-cut");
      }
    });
  }
  function place(root) {
    var all = [root].concat(Array.prototype.slice.call(root.querySelectorAll("[data-width], [data-left]")));
    all.forEach(function (el) {
      if (!el.dataset) return;
      if (el.dataset.width !== undefined) el.style.width = el.dataset.width + "%";
      if (el.dataset.left !== undefined) el.style.left = el.dataset.left + "%";
    });
  }
  htmx.onLoad(place);
  htmx.onLoad(titled);
  var resized = null;
  window.addEventListener("resize", function () {
    clearTimeout(resized);
    resized = setTimeout(function () { titled(document.body); }, 200);
  });
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-copy]");
    if (button && navigator.clipboard) navigator.clipboard.writeText(button.dataset.copy);
  });
})();
