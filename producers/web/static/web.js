// The web view's only script: live countdowns, a refresh of the page's live regions,
// and the log tail. No markup is built here from data: regions are replaced by the
// server's own rendering of the same page (escaped there), log lines are set as text.
"use strict";

(function () {
  // Server clock minus this browser's clock, in seconds: countdowns follow the
  // server's time, so a browser whose clock is off still shows the right time left.
  let offset = 0;

  function syncClock(doc) {
    const now = parseFloat(doc.body.dataset.now);
    if (Number.isFinite(now)) {
      offset = now - Date.now() / 1000;
    }
  }

  function duration(seconds) {
    const span = Math.abs(seconds);
    if (span < 60) return span + " s";
    if (span < 3600) return Math.floor(span / 60) + " min " + String(span % 60).padStart(2, "0") + " s";
    return Math.floor(span / 3600) + " h " + String(Math.floor((span % 3600) / 60)).padStart(2, "0") + " min";
  }

  // As producers/web/text.py left_text.
  function leftText(seconds) {
    const whole = Math.round(seconds);
    return whole >= 0 ? "in " + duration(whole) : "overdue by " + duration(whole);
  }

  function tick() {
    const now = Date.now() / 1000 + offset;
    for (const el of document.querySelectorAll("[data-deadline]")) {
      const left = parseFloat(el.dataset.deadline) - now;
      el.textContent = leftText(left);
      el.classList.toggle("overdue", Math.round(left) < 0);
    }
  }

  function setStatus(text, failed) {
    const el = document.getElementById("live-status");
    if (el) {
      el.textContent = text;
      el.classList.toggle("failed", failed);
    }
  }

  function clockText() {
    return new Date(Date.now() + offset * 1000).toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  async function refresh() {
    try {
      const response = await fetch(location.pathname, { cache: "no-store", credentials: "same-origin" });
      if (!response.ok) {
        setStatus("not updated: HTTP " + response.status + " at " + clockText(), true);
        return;
      }
      const doc = new DOMParser().parseFromString(await response.text(), "text/html");
      syncClock(doc);
      for (const fresh of doc.querySelectorAll("[data-live]")) {
        const current = document.querySelector('[data-live="' + CSS.escape(fresh.dataset.live) + '"]');
        // A region the person is using (a focused select) is left as it is.
        if (current && !current.contains(document.activeElement)) {
          current.replaceWith(document.importNode(fresh, true));
        }
      }
      tick();
      setStatus("live · updated " + clockText(), false);
    } catch (error) {
      setStatus("not updated: the server did not answer (" + clockText() + ")", true);
    }
  }

  async function readLog(pre) {
    try {
      const url = pre.dataset.src + "?after=" + encodeURIComponent(pre.dataset.after);
      const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
      if (!response.ok) return;
      const data = await response.json();
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      for (const entry of data.lines) {
        const span = document.createElement("span");
        span.textContent = entry.line + "\n";
        pre.appendChild(span);
      }
      pre.dataset.after = data.last;
      const keep = parseInt(pre.dataset.keep, 10) || 200;
      while (pre.childElementCount > keep) {
        pre.firstElementChild.remove();
      }
      if (atBottom && data.lines.length) pre.scrollTop = pre.scrollHeight;
    } catch (error) {
      // The page's status line already tells when the server does not answer.
    }
  }

  function every(ms, action) {
    const run = async function () {
      await action();
      setTimeout(run, ms);
    };
    setTimeout(run, ms);
  }

  document.addEventListener("DOMContentLoaded", function () {
    syncClock(document);
    tick();
    setInterval(tick, 1000);
    const period = parseInt(document.body.dataset.refresh, 10);
    if (period > 0) {
      setStatus("live · updated " + clockText(), false);
      every(period, refresh);
    }
    const log = document.getElementById("log");
    if (log) {
      log.scrollTop = log.scrollHeight;
      every(2000, function () { return readLog(log); });
    }
  });
})();
