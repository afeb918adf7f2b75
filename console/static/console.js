// Projector console: refreshes the dashboard every second, posts actions
// without leaving the page, and shows the live tail. No build step.
(function () {
  "use strict";
  var body = document.body;
  var base = body.dataset.base || "";
  var csrf = body.dataset.csrf || "";
  var conn = document.getElementById("conn");
  var live = document.getElementById("live");

  function toast(msg, bad) {
    var box = document.getElementById("toast");
    if (!box) return;
    var d = document.createElement("div");
    if (bad) d.className = "bad";
    d.textContent = msg;
    box.appendChild(d);
    setTimeout(function () { d.remove(); }, bad ? 9000 : 5000);
  }

  function setConn(ok) {
    if (!conn) return;
    conn.textContent = ok ? "live" : "disconnected: retrying";
    conn.classList.toggle("down", !ok);
  }

  // Refresh: fetch the live fragment and swap it in, one request at a time.
  var busy = false;
  function refresh() {
    if (!live || busy || document.hidden) return;
    busy = true;
    fetch(live.dataset.src, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.text().then(function (t) { return { ok: r.ok || r.status === 503, text: t }; }); })
      .then(function (res) {
        setConn(res.ok);
        if (res.ok) live.innerHTML = res.text;
      })
      .catch(function () { setConn(false); })
      .finally(function () { busy = false; });
  }
  if (live) setInterval(refresh, 1000);

  // Actions: POST the form with its CSRF token, show the result, refresh.
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (!form.classList || !form.classList.contains("act")) return;
    e.preventDefault();
    var btn = form.querySelector("button");
    var q = btn && btn.dataset.confirm;
    if (q && !window.confirm(q)) return;
    if (btn) btn.disabled = true;
    fetch(form.action, {
      method: "POST", credentials: "same-origin",
      headers: { "Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded", "X-CSRF-Token": csrf },
      body: new URLSearchParams(new FormData(form)).toString()
    }).then(function (r) {
      return r.json().catch(function () { return { ok: false, message: "HTTP " + r.status }; });
    }).then(function (res) {
      toast(res.message, !res.ok);
      refresh();
    }).catch(function (err) {
      toast("request failed: " + err, true);
    }).finally(function () { if (btn) btn.disabled = false; });
  });

  // Live tail: an EventSource on the live feed. Each message is named by
  // its event type, so listen for every type the registry defines.
  var tail = document.getElementById("tail");
  if (tail) {
    var state = document.getElementById("tail-state");
    var tenantBox = document.getElementById("tail-tenant");
    var types = [];
    try { types = JSON.parse(tail.dataset.types || "[]") || []; } catch (_) { types = []; }
    var es = null, max = 200;
    // The badge says "live" only once the feed answered: a new connection
    // (first, or for another tenant) is "connecting" until then.
    var setState = function (s) { state.textContent = s; state.dataset.state = s; };
    var add = function (cls, parts) {
      var li = document.createElement("li");
      if (cls) li.className = cls;
      parts.forEach(function (p) {
        var s = document.createElement("span");
        s.className = p[0];
        s.textContent = p[1];
        li.appendChild(s);
      });
      tail.insertBefore(li, tail.firstChild);
      while (tail.children.length > max) tail.removeChild(tail.lastChild);
    };
    var onEvent = function (e) {
      var ev = {};
      try { ev = JSON.parse(e.data); } catch (_) { }
      var stream = ev.stream || {};
      add("", [["pos", e.lastEventId], ["type", ev.type || e.type],
        ["stream", (stream.type || "") + "/" + (stream.id || "") + " v" + (ev.version || "")],
        ["tenant", ev.tenant || stream.tenant || ""]]);
    };
    var open = function () {
      if (es) es.close();
      setState("connecting");
      tail.textContent = "";
      var url = tail.dataset.src;
      var tenant = tenantBox && tenantBox.value.trim();
      if (tenant) url += "?tenant=" + encodeURIComponent(tenant);
      es = new EventSource(url);
      es.onopen = function () { setState("live"); };
      es.onerror = function () { setState(es.readyState === EventSource.CLOSED ? "closed" : "reconnecting"); };
      es.onmessage = onEvent;
      types.forEach(function (t) { es.addEventListener(t, onEvent); });
      ["reset", "dropped"].forEach(function (t) {
        es.addEventListener(t, function (e) { add("note", [["type", t], ["", e.data || ""]]); });
      });
    };
    if (tenantBox) tenantBox.addEventListener("change", open);
    open();
  }
})();
