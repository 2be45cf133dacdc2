// edgeplug's lowering report page: the summary, the partitioned graph (laid out by the vendored
// dagre), the tables linked to it. Reads the report from the #edgeplug-report JSON script element.
(function () {
  "use strict";
  var R = JSON.parse(document.getElementById("edgeplug-report").textContent);
  var PALETTE = ["#9fd4a3", "#a5c8f0", "#f5d38c", "#c9b3ea", "#8fd6d0", "#f3b4c9", "#d8d88f", "#b7c4cf"];
  var CPU = "#ffb3ab", IO = "#e8eaed", WEIGHT = "#f6f8fa";
  var COLLAPSE_ABOVE = 400;  // call nodes: a bigger graph opens with its layers collapsed

  function esc(s) {
    return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function el(id) { return document.getElementById(id); }
  // a map keyed by names from the model or a plugin: no prototype, so a module named "constructor"
  // or "__proto__" is a key like any other (with {}, it would find Object's own members)
  function dict() { return Object.create(null); }
  function sum(obj) { var t = 0; for (var k in obj) t += obj[k]; return t; }
  function isCall(n) { return n.op !== "input" && n.op !== "weight" && n.op !== "output"; }
  function shortOp(op) {
    var parts = op.split(".");
    if (parts.length >= 3) return parts[parts.length - 2];  // aten.mm.default -> mm
    return parts[parts.length - 1];
  }
  // the collapsible group of a module path: up to its first numbered part (blocks.3.attn -> blocks.3)
  function groupOf(path) {
    if (!path) return "";
    var parts = path.split("."), out = [];
    for (var i = 0; i < parts.length; i++) {
      out.push(parts[i]);
      if (/^\d+$/.test(parts[i])) return out.join(".");
    }
    return "";
  }

  // -- the two partitionings ----------------------------------------------------------
  function view(name, nodes, partitions, flow) {
    var byName = dict(), colors = dict();
    partitions.forEach(function (p, i) { colors[p.tag] = PALETTE[i % PALETTE.length]; });
    nodes.forEach(function (n) {
      byName[n.name] = n;
      n.group = groupOf(n.module);
      // every module path above the node (blocks, blocks.3, blocks.3.attn): each can be collapsed
      n.prefixes = n.module ? n.module.split(".").map(function (_, i, a) { return a.slice(0, i + 1).join("."); }) : [];
    });
    return { name: name, nodes: nodes, byName: byName, colors: colors, partitions: partitions, flow: flow };
  }
  var views = { edgeplug: view("edgeplug", R.graph || [], R.partitions || [], "edgeplug " + R.backend) };
  if (R.stock && !R.stock.error) views.stock = view("stock", R.stock.graph || [], R.stock.partitions || [], R.stock.flow);
  // a node both graphs hold that one delegates and the other leaves on the CPU
  function differs(n, other) {
    if (!other || !isCall(n)) return false;
    var m = other.byName[n.name];
    return !!m && isCall(m) && (!n.partition) !== (!m.partition);
  }
  var differing = 0;
  if (views.stock) views.edgeplug.nodes.forEach(function (n) { if (differs(n, views.stock)) differing++; });

  function colorOf(v, n) {
    if (n.op === "weight") return WEIGHT;
    if (!isCall(n)) return IO;
    return n.partition ? (v.colors[n.partition] || PALETTE[0]) : CPU;
  }

  // -- summary ------------------------------------------------------------------------------
  function card(label, value, id) {
    return '<div class="card"' + (id ? ' id="' + id + '"' : "") + '><b>' + esc(value) + "</b>" + esc(label) + "</div>";
  }
  function summary() {
    var v = R.verification, total = 0;
    (R.stages || []).forEach(function (s) { total += s.seconds; });
    var verified = v ? (v.outputs.every(function (o) { return !o.problems || !o.problems.length; }) ? "passed" : "FAILED") : "not run";
    el("cards").innerHTML =
      card("partitions", (R.partitions || []).length, "sum-partitions") +
      card(R.dry_run ? "nodes would be delegated" : "delegated nodes", sum(R.delegated_ops || {}), "sum-delegated") +
      card("CPU nodes", sum(R.cpu_ops || {}), "sum-cpu") +
      card("fusions", (R.fusions || []).length, "sum-fusions") +
      card("transforms", (R.transforms || []).length, "sum-transforms") +
      card("verification", verified, "sum-verification") +
      card("lowering time", total.toFixed(2) + " s", "sum-time");
    table(el("stages"), ["stage", "seconds"], (R.stages || []).map(function (s) { return [s.stage, +s.seconds.toFixed(3)]; }));
    table(el("partitions"), ["partition", "delegate", "nodes", "ops"], (R.partitions || []).map(function (p) {
      var ops = Object.keys(p.ops).sort(function (a, b) { return p.ops[b] - p.ops[a]; });
      return [p.tag, p.backend_id, p.nodes, ops.map(function (o) { return shortOp(o) + " x" + p.ops[o]; }).join(", ")];
    }), function (row) { selectFirst(function (n) { return n.partition === row[0]; }); });
    if (R.notes && R.notes.length) el("notes").innerHTML = R.notes.map(function (n) { return "<li>" + esc(n) + "</li>"; }).join("");
  }

  // -- stock comparison ----------------------------------------------------------------------
  function compare() {
    if (!R.stock) return;
    el("compare-section").hidden = false;
    var S = R.stock;
    if (S.error) { el("compare").innerHTML = '<p class="bad">' + esc(S.error) + "</p>"; return; }
    function kinds(ops) { return Object.keys(ops || {}).length; }
    var rows = [
      ["partitions", R.partitions.length, S.partitions.length],
      ["delegated nodes", sum(R.delegated_ops), sum(S.delegated_ops)],
      ["CPU nodes", sum(R.cpu_ops), sum(S.cpu_ops)],
      ["delegated op kinds", kinds(R.delegated_ops), kinds(S.delegated_ops)],
    ].map(function (r) { return [r[0], r[1], r[2], r[1] - r[2]]; });
    rows.push(["nodes both graphs hold, delegated in one and on the CPU in the other", differing, "", ""]);
    table(el("compare"), ["", "edgeplug", "stock", "difference"], rows);
    el("compare").querySelectorAll("tr").forEach(function (tr, i) { if (i) tr.dataset.count = tr.cells[0].textContent; });
    var ops = dict();
    [[R.delegated_ops, 0], [S.delegated_ops, 1], [R.cpu_ops, 2], [S.cpu_ops, 3]].forEach(function (pair) {
      for (var op in pair[0]) { (ops[op] = ops[op] || [0, 0, 0, 0])[pair[1]] += pair[0][op]; }
    });
    var opRows = Object.keys(ops).filter(function (o) { var c = ops[o]; return c[0] !== c[1] || c[2] !== c[3]; })
      .map(function (o) { return [o].concat(ops[o]); });
    table(el("compare-ops"), ["op", "delegated (edgeplug)", "delegated (stock)", "CPU (edgeplug)", "CPU (stock)"], opRows);
    el("flow-stock").textContent = S.flow;
  }

  // -- sortable tables ----------------------------------------------------------------------
  function table(t, head, rows, onClick) {
    var html = "<thead><tr>" + head.map(function (h) { return "<th>" + esc(h) + "</th>"; }).join("") + "</tr></thead><tbody>";
    rows.forEach(function (r, i) {
      html += '<tr data-row="' + i + '"' + (onClick ? ' class="link"' : "") + ">" + r.map(function (c) {
        return "<td" + (typeof c === "number" ? ' class="num"' : "") + ">" + esc(c) + "</td>";
      }).join("") + "</tr>";
    });
    t.innerHTML = html + "</tbody>";
    var body = t.tBodies[0];
    t.querySelectorAll("th").forEach(function (th, col) {
      th.addEventListener("click", function () {
        var asc = !th.classList.contains("asc");
        t.querySelectorAll("th").forEach(function (h) { h.classList.remove("asc", "desc"); });
        th.classList.add(asc ? "asc" : "desc");
        var trs = Array.prototype.slice.call(body.rows);
        trs.sort(function (a, b) {
          var x = rows[a.dataset.row][col], y = rows[b.dataset.row][col];
          var c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
          return asc ? c : -c;
        });
        trs.forEach(function (tr) { body.appendChild(tr); });
      });
    });
    if (onClick) body.addEventListener("click", function (e) {
      var tr = e.target.closest("tr");
      if (tr) onClick(rows[tr.dataset.row]);
    });
  }
  function tables() {
    table(el("cpu-nodes"), ["node", "op", "reason"], (R.cpu_nodes || []).map(function (c) { return [c.node, c.op, c.reason]; }),
      function (row) { select(row[0], "edgeplug"); });
    table(el("fusions"), ["pattern", "anchor", "outcome", "eps", "weight", "reason"], (R.fusions || []).map(function (f) {
      return [f.pattern, f.anchor, f.outcome, f.eps == null ? "" : f.eps, f.weight || "", f.reason || ""];
    }), function (row) {
      var v = views.edgeplug;
      if (v.byName[row[1]]) return select(row[1], "edgeplug");
      selectFirst(function (n) { return (n.fusion || "").indexOf(" at " + row[1] + ":") >= 0; });
    });
    table(el("transforms"), ["transform", "kind", "node", "op", "outcome", "removed", "added", "detail"],
      (R.transforms || []).map(function (t) { return [t.transform, t.kind, t.node, t.op, t.outcome, t.removed, t.added, t.detail || ""]; }),
      function (row) { if (views.edgeplug.byName[row[2]]) select(row[2], "edgeplug"); });
  }

  // -- the graph --------------------------------------------------------------------------------
  var state = { view: "edgeplug", collapsed: dict(), weights: false, selected: null, query: "", pos: dict(), tx: 0, ty: 0, k: 1 };
  function current() { return views[state.view]; }
  function unitOf(n) {
    for (var i = 0; i < n.prefixes.length; i++) if (state.collapsed[n.prefixes[i]]) return "group:" + n.prefixes[i];
    return n.name;
  }
  function visible(n) { return state.weights || n.op !== "weight"; }
  function matches(n) {
    var q = state.query;
    return !!q && (n.name.toLowerCase().indexOf(q) >= 0 || n.op.toLowerCase().indexOf(q) >= 0);
  }

  function render() {
    var v = current(), other = views[state.view === "edgeplug" ? "stock" : "edgeplug"];
    var g = new dagre.graphlib.Graph({ multigraph: false });
    g.setGraph({ rankdir: "TB", nodesep: 18, ranksep: 26, marginx: 10, marginy: 10 });
    g.setDefaultEdgeLabel(function () { return {}; });
    var units = dict(), unitIds = [];
    v.nodes.forEach(function (n) {
      if (!visible(n)) return;
      var id = unitOf(n), u = units[id];
      if (!u) {
        u = units[id] = { id: id, nodes: [], group: id.indexOf("group:") === 0 ? id.slice(6) : null };
        unitIds.push(id);
      }
      u.nodes.push(n);
    });
    unitIds.forEach(function (id) {
      var u = units[id], w, h = 34;
      if (u.group) {
        u.label = u.group + " (" + u.nodes.length + " nodes)";
        var calls = u.nodes.filter(isCall), cpu = calls.filter(function (n) { return !n.partition; });
        var count = dict();
        calls.forEach(function (n) { if (n.partition) count[n.partition] = (count[n.partition] || 0) + 1; });
        var top = Object.keys(count).sort(function (a, b) { return count[b] - count[a]; })[0];
        u.cpu = cpu.length;
        u.sub = cpu.length ? cpu.length + " on CPU" : (top ? "all in " + top : "");
        u.color = top ? v.colors[top] : (calls.length ? CPU : IO);
        w = Math.max(u.label.length, u.sub.length) * 6.8 + 20; h = 40;
      } else {
        var n = u.nodes[0];
        u.label = isCall(n) ? shortOp(n.op) : n.op;
        u.sub = n.name;
        u.color = colorOf(v, n);
        w = Math.max(u.label.length, u.sub.length) * 6.8 + 16;
      }
      u.w = w; u.h = h;
      g.setNode(id, { width: w, height: h });
    });
    var seen = dict();
    v.nodes.forEach(function (n) {
      if (!visible(n)) return;
      var to = unitOf(n);
      n.inputs.forEach(function (i) {
        var m = v.byName[i];
        if (!m || !visible(m)) return;
        var from = unitOf(m), key = from + "\u0000" + to;
        if (from === to || seen[key]) return;
        seen[key] = 1;
        g.setEdge(from, to);
      });
    });
    dagre.layout(g);
    var parts = [];
    g.edges().forEach(function (e) {
      var pts = g.edge(e).points;
      parts.push('<path class="edge" d="M' + pts.map(function (p) { return p.x.toFixed(1) + "," + p.y.toFixed(1); }).join("L") + '"/>');
    });
    state.pos = dict();
    unitIds.forEach(function (id) {
      var u = units[id], p = g.node(id), x = p.x - u.w / 2, y = p.y - u.h / 2;
      state.pos[id] = p;
      var cls, attrs;
      if (u.group) {
        cls = "group" + (u.cpu ? " has-cpu" : "") + (u.nodes.some(matches) ? " match" : "") +
          (u.nodes.some(function (n) { return differs(n, other); }) ? " differs" : "");
        attrs = ' data-group="' + esc(u.group) + '" data-cpu-count="' + u.cpu + '"';
      } else {
        var n = u.nodes[0];
        cls = "node" + (isCall(n) && !n.partition ? " cpu" : "") + (matches(n) ? " match" : "") +
          (differs(n, other) ? " differs" : "") + (state.selected === n.name ? " selected" : "");
        attrs = ' data-name="' + esc(n.name) + '" data-op="' + esc(n.op) + '"' +
          (isCall(n) ? (n.partition ? ' data-partition="' + esc(n.partition) + '"' : ' data-cpu="1"') : "");
      }
      parts.push('<g class="' + cls + '"' + attrs + ' transform="translate(' + x.toFixed(1) + "," + y.toFixed(1) + ')">' +
        '<rect width="' + u.w.toFixed(1) + '" height="' + u.h + '" fill="' + u.color + '"></rect>' +
        '<text x="8" y="14">' + esc(u.label) + '</text><text x="8" y="' + (u.h - 8) + '" fill="#57606a">' + esc(u.sub) + "</text></g>");
    });
    var box = g.graph();
    state.width = box.width || 100; state.height = box.height || 100;
    if (!v.nodes.length) parts.push('<text x="20" y="30">This report holds no graph (written before edgeplug recorded one): lower the model again.</text>');
    el("viewport").innerHTML = parts.join("");
    el("graph-status").textContent = v.flow + ": " + unitIds.length + " boxes drawn (" + v.nodes.length + " nodes; " +
      Object.keys(state.collapsed).filter(function (k) { return state.collapsed[k]; }).length + " groups collapsed)";
    legend();
  }

  function legend() {
    var v = current();
    el("legend").innerHTML = v.partitions.map(function (p) {
      return '<span data-partition="' + esc(p.tag) + '"><i class="sw" style="background:' + v.colors[p.tag] + '"></i>' +
        esc(p.tag) + " (" + p.nodes + ")</span>";
    }).join("") + '<span data-cpu="1"><i class="sw" style="background:' + CPU + '"></i>CPU (' +
      v.nodes.filter(function (n) { return isCall(n) && !n.partition; }).length + ")</span>" +
      '<span><i class="sw" style="background:' + IO + '"></i>input / output</span>';
  }

  function transform() {
    el("viewport").setAttribute("transform", "translate(" + state.tx + "," + state.ty + ") scale(" + state.k + ")");
  }
  function fit() {
    var box = el("graph").getBoundingClientRect();
    state.k = Math.min(1.2, Math.max(0.05, (box.width - 20) / state.width));
    state.tx = Math.max(10, (box.width - state.width * state.k) / 2); state.ty = 10;
    transform();
  }
  function center(id) {
    var p = state.pos[id], box = el("graph").getBoundingClientRect();
    if (!p) return;
    state.k = Math.max(state.k, 0.8);
    state.tx = box.width / 2 - p.x * state.k; state.ty = box.height / 2 - p.y * state.k;
    transform();
  }

  function detail(n) {
    var v = current(), other = views[state.view === "edgeplug" ? "stock" : "edgeplug"];
    var rows = [["node", n.name], ["op", n.op]];
    if (isCall(n)) rows.push(n.partition ? ["partition", n.partition] : ["on the CPU", n.reason || "(no reason recorded)"]);
    rows.push(["shape", n.shape || "?"], ["dtype", n.dtype || "?"], ["module", n.module || "(none)"]);
    if (n.fusion) rows.push(["fusion / transform", n.fusion]);
    if (other && other.byName[n.name] && isCall(n)) {
      var m = other.byName[n.name];
      rows.push(["in " + other.name + "'s partitioning", m.partition ? m.partition : "CPU" + (m.reason ? ": " + m.reason : "")]);
    }
    var users = v.nodes.filter(function (m) { return m.inputs.indexOf(n.name) >= 0; }).map(function (m) { return m.name; });
    var html = "<dl>" + rows.map(function (r) {
      return "<dt>" + esc(r[0]) + '</dt><dd class="' + (r[0] === "on the CPU" ? "bad reason" : "") + '">' + esc(r[1]) + "</dd>";
    }).join("");
    function links(label, names) {
      if (!names.length) return "";
      return "<dt>" + label + "</dt><dd>" + names.map(function (x) {
        return '<button class="linklike" data-goto="' + esc(x) + '">' + esc(x) + "</button>";
      }).join(", ") + "</dd>";
    }
    html += links("reads", n.inputs) + links("read by", users);
    if (n.prefixes.length) html += "<dt>collapse its module</dt><dd>" + n.prefixes.map(function (p) {
      return '<button class="linklike" data-collapse="' + esc(p) + '">' + esc(p) + "</button>";
    }).join(" \u203a ") + "</dd>";
    el("detail").innerHTML = html + "</dl>";
  }

  function select(name, viewName) {
    if (viewName && viewName !== state.view && views[viewName]) setView(viewName);
    var v = current(), n = v.byName[name];
    if (!n) return;
    var redraw = false;
    n.prefixes.forEach(function (p) { if (state.collapsed[p]) { state.collapsed[p] = false; redraw = true; } });
    if (n.op === "weight" && !state.weights) { state.weights = true; el("weights").checked = true; redraw = true; }
    state.selected = name;
    if (redraw) render();
    else el("viewport").querySelectorAll("g.node.selected").forEach(function (g) { g.classList.remove("selected"); });
    var g = el("viewport").querySelector('g.node[data-name="' + CSS.escape(name) + '"]');
    if (g) g.classList.add("selected");
    detail(n);
    center(name);
  }
  function selectFirst(pred) {
    var n = current().nodes.filter(pred)[0];
    if (n) select(n.name);
  }
  function setView(name) {
    state.view = name; state.selected = null;
    el("view-" + name).checked = true;
    render(); fit();
  }
  function collapseAll(on) {
    state.collapsed = dict();
    if (on) current().nodes.forEach(function (n) { if (n.group) state.collapsed[n.group] = true; });
    render(); fit();
  }

  function wire() {
    var svg = el("svg"), drag = null;
    svg.addEventListener("click", function (e) {
      var g = e.target.closest("g.node, g.group");
      if (!g) return;
      if (g.dataset.group) {  // expand it, and keep its first node in view
        var grp = g.dataset.group;
        state.collapsed[grp] = false;
        render();
        var first = current().nodes.filter(function (n) { return visible(n) && n.prefixes.indexOf(grp) >= 0; })[0];
        if (first) center(unitOf(first));
        return;
      }
      select(g.dataset.name);
    });
    svg.addEventListener("mouseover", function (e) {
      var g = e.target.closest("g.node");
      if (g && !state.selected) detail(current().byName[g.dataset.name]);
    });
    svg.addEventListener("mousedown", function (e) { drag = { x: e.clientX - state.tx, y: e.clientY - state.ty }; });
    window.addEventListener("mouseup", function () { drag = null; });
    window.addEventListener("mousemove", function (e) {
      if (!drag) return;
      state.tx = e.clientX - drag.x; state.ty = e.clientY - drag.y; transform();
    });
    svg.addEventListener("wheel", function (e) {
      e.preventDefault();
      var box = svg.getBoundingClientRect(), mx = e.clientX - box.left, my = e.clientY - box.top;
      var k = Math.min(4, Math.max(0.02, state.k * (e.deltaY < 0 ? 1.15 : 1 / 1.15)));
      state.tx = mx - (mx - state.tx) * k / state.k; state.ty = my - (my - state.ty) * k / state.k; state.k = k;
      transform();
    }, { passive: false });
    el("detail").addEventListener("click", function (e) {
      var b = e.target.closest("button");
      if (!b) return;
      if (b.dataset.goto) select(b.dataset.goto);
      if (b.dataset.collapse) { state.collapsed[b.dataset.collapse] = true; state.selected = null; render(); center("group:" + b.dataset.collapse); }
    });
    el("search").addEventListener("input", function () {
      state.query = el("search").value.trim().toLowerCase();
      var found = state.query ? current().nodes.filter(matches) : [];
      el("matches").innerHTML = state.query ? found.length + " match" + (found.length === 1 ? "" : "es") + ": " +
        found.slice(0, 60).map(function (n) { return '<a data-goto="' + esc(n.name) + '">' + esc(n.name) + "</a>"; }).join("") : "";
      render();
    });
    el("search").addEventListener("keydown", function (e) {
      if (e.key !== "Enter") return;
      var first = current().nodes.filter(matches)[0];
      if (first) select(first.name);
    });
    el("matches").addEventListener("click", function (e) { if (e.target.dataset.goto) select(e.target.dataset.goto); });
    el("collapse").addEventListener("click", function () { collapseAll(true); });
    el("expand").addEventListener("click", function () { collapseAll(false); });
    el("fit").addEventListener("click", fit);
    el("weights").addEventListener("change", function () { state.weights = el("weights").checked; render(); });
    document.querySelectorAll("input[name=view]").forEach(function (r) {
      r.addEventListener("change", function () { if (r.checked) setView(r.value); });
    });
    if (!views.stock) el("views").hidden = true;
  }

  el("title").textContent = "edgeplug lowering report: " + R.model + " \u2192 " + R.backend + (R.dry_run ? " (dry run)" : "");
  el("subtitle").textContent = R.distribution + (R.output_path ? "; wrote " + R.output_path + " (" + R.output_bytes + " bytes)" : "");
  summary(); compare(); tables(); wire();
  var calls = views.edgeplug.nodes.filter(isCall).length;
  if (calls > COLLAPSE_ABOVE) views.edgeplug.nodes.forEach(function (n) { if (n.group) state.collapsed[n.group] = true; });
  render(); fit();
  document.body.dataset.ready = "1";
})();
