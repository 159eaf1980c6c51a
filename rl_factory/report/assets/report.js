// The report page: plotly.js charts from figure specs, and the trajectory browser (filter, list, detail).
// Everything it needs is in the page: #report-data holds {title, runs, evals, figures, tournaments, trajectories,
// total}.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var T = D.trajectories;
  var LIST_LIMIT = 300; // rows drawn at once; the filter narrows the rest

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "cls") node.className = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) node.appendChild(c); });
    return node;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined || (typeof v === "number" && isNaN(v))) return "n/a";
    return typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(digits === undefined ? 3 : digits)) : String(v);
  }
  function table(header, rows) {
    var head = el("tr", {}, header.map(function (h) { return el("th", {text: h}); }));
    var body = rows.map(function (r) { return el("tr", {}, r.map(function (c) { return el("td", {text: fmt(c)}); })); });
    return el("table", {}, [el("thead", {}, [head]), el("tbody", {}, body)]);
  }

  // ---- header: runs, config differences, evaluation results -------------------------------------
  document.getElementById("subtitle").textContent = D.subtitle;
  var runKeys = ["name", "run id", "directory", "steps", "val accuracy (first -> last)", "val reward (first -> last)"];
  document.getElementById("runs").appendChild(table(runKeys, D.runs.map(function (r) {
    return [r.name, r.run_id, r.path, r.steps, fmt(r.val_acc_first) + " -> " + fmt(r.val_acc_last),
            fmt(r.val_reward_first) + " -> " + fmt(r.val_reward_last)];
  })));
  if (D.config_diff.length) {
    var names = D.runs.map(function (r) { return r.name; });
    var wrap = el("div", {}, [el("p", {cls: "note", text: "Config keys that differ between the runs:"}),
      table(["key"].concat(names), D.config_diff.map(function (d) { return [d.key].concat(d.values); }))]);
    document.getElementById("runs").appendChild(wrap);
  }
  if (D.evals.length) {
    document.getElementById("eval-section").hidden = false;
    var box = document.getElementById("evals");
    D.evals.forEach(function (e) {
      box.appendChild(el("p", {cls: "note", text: e.name + ": " + e.summary}));
      box.appendChild(table(["metric", "value"], e.metrics));
      if (e.failures.length) {
        box.appendChild(el("p", {cls: "note", text: "Failure taxonomy (trajectories that did not succeed):"}));
        box.appendChild(table(["failure", "count", "share", "example ids"], e.failures));
      }
      if (e.compare.length) {
        box.appendChild(el("p", {cls: "note", text: "Compared with " + e.compare_with + " (difference = this - other, 95% bootstrap CI):"}));
        box.appendChild(table(["metric", "this", "other", "difference", "95% CI"], e.compare));
      }
    });
  }

  // ---- run guard: every violation, with its bundle (python -m rl_factory.guard replay <bundle>) -----
  if (D.guard && D.guard.length) {
    document.getElementById("guard-section").hidden = false;
    document.getElementById("guard").appendChild(table(["run", "step", "check", "action", "what it found", "bundle"],
      D.guard.map(function (g) { return [g.run, g.step, g.check, g.action, g.message, g.bundle]; })));
  }

  // ---- charts --------------------------------------------------------------------------------------
  var charts = document.getElementById("charts");
  if (!D.figures.length) charts.appendChild(el("p", {cls: "empty", text: "No metrics logged yet."}));
  D.figures.forEach(function (fig) {
    var div = el("div", {cls: "chart", id: "chart-" + fig.id});
    charts.appendChild(div);
    // the toolbar only while the pointer is over the chart: it never sits on the title of a chart being read
    Plotly.newPlot(div, fig.data, fig.layout, {responsive: true, displaylogo: false, displayModeBar: "hover"});
  });

  // ---- tournament tables (arena runs: rankings.csv + matches.csv) ---------------------------------
  var TT = D.tournaments || [];
  if (TT.length) {
    document.getElementById("tournament-section").hidden = false;
    var tRun = document.getElementById("t-run"), tStep = document.getElementById("t-step");
    var tRuns = [];
    TT.forEach(function (t) { if (tRuns.indexOf(t.run) < 0) tRuns.push(t.run); });
    tRuns.forEach(function (r) { tRun.appendChild(el("option", {value: r, text: r})); });
    if (tRuns.length < 2) document.getElementById("l-t-run").hidden = true;
    var fillSteps = function () {
      tStep.textContent = "";
      var steps = [];
      TT.forEach(function (t) { if (t.run === tRun.value && steps.indexOf(t.step) < 0) steps.push(t.step); });
      steps.forEach(function (s) { tStep.appendChild(el("option", {value: s, text: s})); });
      tStep.value = steps[steps.length - 1];
    };
    var cellText = function (v) { return v === null || v === undefined ? "" : v === 0.5 ? "½" : fmt(v, 2); };
    var drawTournaments = function () {
      var box = document.getElementById("tournaments");
      box.textContent = "";
      TT.filter(function (t) { return t.run === tRun.value && String(t.step) === tStep.value; }).forEach(function (t) {
        var ids = t.players.map(function (p) { return p.rollout; });
        var header = ["rollout", "rank", "score", "record", "reward", "answer"].concat(ids.map(function (i) { return "vs " + i; }));
        var rows = t.players.map(function (p) {
          var cells = [p.rollout, p.rank, fmt(p.score, 3), p.record, fmt(p.reward), p.answer === null || p.answer === undefined ? "" : p.answer];
          return cells.concat(p.vs.map(function (v, k) { return ids[k] === p.rollout ? "·" : cellText(v); }));
        });
        box.appendChild(el("p", {cls: "note", text: "step " + t.step + " · group " + t.group + " · prompt " + t.prompt}));
        var tbl = table(header, rows);
        tbl.className = "tournament";
        box.appendChild(tbl);
      });
    };
    tRun.addEventListener("change", function () { fillSteps(); drawTournaments(); });
    tStep.addEventListener("change", drawTournaments);
    fillSteps();
    drawTournaments();
  }

  // ---- trajectory browser --------------------------------------------------------------------------
  var $ = function (id) { return document.getElementById(id); };
  function options(select, values) {
    values.forEach(function (v) { select.appendChild(el("option", {value: v, text: v})); });
  }
  function uniq(key) {
    var seen = {};
    T.forEach(function (t) { [].concat(t[key]).forEach(function (v) { if (v !== null && v !== undefined && v !== "") seen[v] = 1; }); });
    return Object.keys(seen).sort();
  }
  options($("f-run"), D.runs.map(function (r) { return r.name; }));
  if (D.runs.length < 2) { $("l-run").style.display = "none"; document.body.classList.add("single-run"); }
  options($("f-split"), uniq("split"));
  options($("f-stop"), uniq("stop"));
  options($("f-error"), uniq("errors"));
  T.forEach(function (t) {  // one lower-case haystack per trajectory for the text filter
    var parts = [t.answer || "", t.id || "", t.data_source || ""];
    t.messages.forEach(function (m) {
      parts.push(m.content || "");
      (m.tool_calls || []).forEach(function (c) { parts.push(c.name || "", c.arguments || ""); });
    });
    t._text = parts.join("\n").toLowerCase();
  });

  function num(id) { var v = $(id).value; return v === "" ? null : Number(v); }
  function matches(t) {
    var run = $("f-run").value, split = $("f-split").value, stop = $("f-stop").value, err = $("f-error").value;
    var text = $("f-text").value.trim().toLowerCase();
    var s0 = num("f-step-min"), s1 = num("f-step-max"), r0 = num("f-reward-min"), r1 = num("f-reward-max");
    if (run && t.run !== run) return false;
    if (split && t.split !== split) return false;
    if (stop && t.stop !== stop) return false;
    if (s0 !== null && t.step < s0) return false;
    if (s1 !== null && t.step > s1) return false;
    if (r0 !== null && (t.reward === null || t.reward < r0)) return false;
    if (r1 !== null && (t.reward === null || t.reward > r1)) return false;
    if (err === "__none" && t.errors.length) return false;
    if (err === "__some" && !t.errors.length) return false;
    if (err && err.indexOf("__") !== 0 && t.errors.indexOf(err) < 0) return false;
    if (text && t._text.indexOf(text) < 0) return false;
    return true;
  }
  var SPLIT_ORDER = {train: 0};  // at one step, the training rollouts before validation's
  function splitRank(t) { return t.split in SPLIT_ORDER ? SPLIT_ORDER[t.split] : 1; }
  var SORTS = {
    "step-desc": function (a, b) {
      return b.step - a.step || splitRank(a) - splitRank(b) || a.run.localeCompare(b.run) || a.i - b.i;
    },
    "step": function (a, b) { return a.step - b.step || a.run.localeCompare(b.run) || a.i - b.i; },
    "reward-desc": function (a, b) { return (b.reward ?? -Infinity) - (a.reward ?? -Infinity); },
    "reward-asc": function (a, b) { return (a.reward ?? Infinity) - (b.reward ?? Infinity); },
    "adv-desc": function (a, b) { return (b.advantage ?? -Infinity) - (a.advantage ?? -Infinity); },
    "adv-asc": function (a, b) { return (a.advantage ?? Infinity) - (b.advantage ?? Infinity); }
  };

  var selected = null;
  function render() {
    var shown = T.filter(matches).sort(SORTS[$("f-sort").value]);
    var note = shown.length + " of " + T.length + " trajectories match";
    if (D.total > T.length) note += " (the page holds " + T.length + " of the runs' " + D.total + ")";
    if (shown.length > LIST_LIMIT) note += "; the first " + LIST_LIMIT + " are listed";
    $("match-count").textContent = note;
    var body = $("traj-list").tBodies[0];
    body.textContent = "";
    shown.slice(0, LIST_LIMIT).forEach(function (t) {
      var errs = el("td", {text: t.errors.length ? t.errors.join(", ") : "", cls: t.errors.length ? "err" : ""});
      var cells = [t.run, t.split, t.step, t.group, t.rollout, t.id || t.sample, fmt(t.reward), fmt(t.advantage), t.stop,
                   t.turns, t.calls];
      var row = el("tr", {}, cells.map(function (c, k) { return el("td", {text: fmt(c), cls: k === 0 ? "c-run" : ""}); }).concat([errs]));
      if (t === selected) row.className = "selected";
      row.addEventListener("click", function () { selected = t; render(); });
      body.appendChild(row);
    });
    if (selected && !matches(selected)) selected = null;
    showDetail(selected || shown[0] || null);
  }

  function showDetail(t) {
    var box = $("traj-detail");
    box.textContent = "";
    if (!t) { box.appendChild(el("span", {cls: "empty", text: "No trajectory matches the filter."})); return; }
    var info = Object.keys(t.reward_info).map(function (k) { return k + "=" + fmt(t.reward_info[k]); }).join(", ");
    var meta = [
      "run " + t.run + " · " + t.split + " step " + t.step + " · group " + t.group + ", rollout " + t.rollout +
        " · sample " + (t.id || t.sample) +
        (t.data_source ? " · " + t.data_source : ""),
      "reward " + fmt(t.reward) + " · advantage " + fmt(t.advantage) + " · stop: " + t.stop + " · turns " + t.turns +
        " · tokens prompt/generated/total " + t.tokens.map(fmt).join("/"),
      "reward components: " + (info || "none") + (t.process_rewards.length ? " · per-turn: " + t.process_rewards.map(function (x) { return fmt(x, 2); }).join(", ") : ""),
      "expected answer: " + (t.answer === null ? "n/a" : t.answer)
    ];
    box.appendChild(el("div", {cls: "meta"}, meta.map(function (line) { return el("div", {text: line}); })));
    t.messages.forEach(function (m) {
      var cls = "msg " + m.role + (m.role === "tool" && m.error_kind ? " failed" : "");
      var label = m.role + (m.role === "tool" ? " result" + (m.name ? " · " + m.name : "") +
        (m.error_kind ? " · error: " + m.error_kind : "") + (m.latency_s !== undefined && m.latency_s !== null ? " · " + fmt(m.latency_s) + " s" : "") : "");
      var parts = [el("div", {cls: "role", text: label})];
      if (m.content) parts.push(el("pre", {text: m.content}));
      (m.tool_calls || []).forEach(function (c) {
        parts.push(el("div", {cls: "call"}, [el("span", {cls: "name", text: "tool call → " + c.name}), el("pre", {text: c.arguments})]));
      });
      box.appendChild(el("div", {cls: cls}, parts));
    });
  }

  ["f-run", "f-split", "f-stop", "f-error", "f-sort"].forEach(function (id) { $(id).addEventListener("change", render); });
  ["f-text", "f-step-min", "f-step-max", "f-reward-min", "f-reward-max"].forEach(function (id) { $(id).addEventListener("input", render); });
  render();
})();
