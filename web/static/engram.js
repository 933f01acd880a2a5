// The dashboard's only script of its own (htmx does the rest).
//
// A click is a press and a release on the same element. A refresh that swaps a region
// (the overview's poll, a list narrowing as you type) between the two replaces the
// element under the pointer, and the browser then drops the click: the operator
// pressed "Pause jobs" and nothing happened. So while the pointer is down, a swap into
// a region holding what it pressed is skipped. Polled regions bring the next refresh
// a moment later; anything else the press itself asked for swaps after the release.
(function () {
  "use strict";
  // What only holds with the script running (a page that refreshes itself) is shown
  // only then: CSS hides .with-js until this class is set.
  document.documentElement.classList.add("js");
  let pressed = null;
  function release() {
    setTimeout(function () { pressed = null; }, 0); // after the click this release makes
  }
  document.addEventListener("pointerdown", function (event) { pressed = event.target; }, true);
  document.addEventListener("pointerup", release, true);
  document.addEventListener("pointercancel", release, true);
  window.addEventListener("blur", release);
  document.addEventListener("htmx:beforeSwap", function (event) {
    const region = event.detail.target;
    if (pressed && region && region.contains(pressed)) {
      event.detail.shouldSwap = false;
    }
  });
})();
