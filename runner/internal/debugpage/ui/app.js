// shardhost debug page: reloads its own server-rendered body every
// data-refresh ms, shows a tooltip over shard cells and highlights the
// shards of a runner when its row is clicked. No dependencies.
(function () {
  "use strict";
  var body = document.body, every = +body.dataset.refresh || 0;
  var updates = 0, paused = false, focus = null, timer = null, took = 0;
  var $ = function (id) { return document.getElementById(id); };
  function meta() {
    try { return JSON.parse($("meta").textContent); } catch (e) { return { runners: [] }; }
  }
  function status(text) { var s = $("status"); if (s) s.textContent = text; }
  function applyFocus() {
    var g = $("grid");
    if (!g) return;
    if (focus === null) g.removeAttribute("data-focus"); else g.setAttribute("data-focus", focus);
    var rows = document.querySelectorAll("tr.runner");
    for (var i = 0; i < rows.length; i++) rows[i].classList.toggle("focus", rows[i].dataset.idx === focus);
  }
  // A refresh that took long (a map of 65 536 shards on a slow machine)
  // spaces the next ones: at most a fifth of the time goes to refreshing.
  function schedule() {
    clearTimeout(timer);
    if (every > 0 && !paused) timer = setTimeout(refresh, Math.max(every, 4 * took));
  }
  function refresh() {
    var start = performance.now();
    var u = new URL(location.href);
    u.searchParams.set("part", "body");
    fetch(u, { cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error(r.status + " " + r.statusText);
      return r.text();
    }).then(function (html) {
      $("main").innerHTML = html;
      body.dataset.updated = String(++updates);
      applyFocus();
      took = performance.now() - start;
      status(4 * took > every ? "a refresh took " + Math.round(took) + " ms: refreshing every " + Math.round(4 * took) + " ms ·" : "");
    }).catch(function (e) {
      status("refresh failed: " + e.message);
    }).then(schedule);
  }
  document.addEventListener("click", function (e) {
    var row = e.target.closest && e.target.closest("tr.runner");
    if (row && !e.target.closest("a")) {
      focus = focus === row.dataset.idx ? null : row.dataset.idx;
      applyFocus();
    }
    if (e.target.id === "pause") {
      paused = !paused;
      e.target.textContent = paused ? "resume" : "pause";
      if (!paused) refresh(); else clearTimeout(timer);
    }
  });
  var tip = $("tip");
  document.addEventListener("mouseover", function (e) {
    var g = $("grid"), cell = e.target;
    if (!g || cell.parentNode !== g) { tip.hidden = true; return; }
    var i = Array.prototype.indexOf.call(g.children, cell), m = meta();
    var c = cell.classList[0] || "", lines = ["shard " + i];
    lines.push("owner: " + (c === "u" ? "none (unowned)" : c === "x" ? "a lease of no registered runner" : (m.runners[+c.slice(1)] || "?")));
    if (cell.classList.contains("d")) lines.push("the owner does not answer or is detached");
    if (m.moves && m.moves[i] !== undefined) lines.push("assigned to: " + m.moves[i]);
    if (m.handoffs && m.handoffs[i]) lines.push("handoff: " + m.handoffs[i]);
    tip.textContent = lines.join("\n");
    tip.hidden = false;
  });
  document.addEventListener("mousemove", function (e) {
    if (!tip.hidden) { tip.style.left = (e.clientX + 14) + "px"; tip.style.top = (e.clientY + 12) + "px"; }
  });
  schedule();
})();
