// A tiny SVG line chart for per-epoch curves: no dependencies, no network, no inline styles.
//
//   const chart = new LineChart(figure, [{name: "train loss", color: "#2563eb"}, ...]);  // also width, dash
//   chart.set("train loss", [[1, 0.52], [2, 0.41]]);   // whole series
//   chart.add("train loss", 3, 0.37);                   // one point (replaces the same x)
//
// A series may also say `label` (its legend text, default its name), `line: false` (points only,
// a scatter), `hollow: true` (open points), `radius` and `attrs` (extra attributes of its <g>).
// Options: `yMin`, `xMin` (default 1), `xMax`, `xLabel` (default "epoch"), `empty` (placeholder).
// The figure's data-points attribute holds the longest series' length (tests read it).
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 640, HEIGHT = 260;
  const MARGIN = {top: 12, right: 16, bottom: 30, left: 56};

  function el(name, attrs, text) {
    const node = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function niceTicks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / count;
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(+t.toFixed(12));
    return ticks;
  }

  function format(value) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    const abs = Math.abs(value);
    if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(2);
    return String(+value.toPrecision(4));
  }

  class LineChart {
    constructor(figure, series, options) {
      this.figure = figure;
      this.options = options || {};
      this.series = series.map((s) => ({...s, points: new Map()}));
      this.svg = el("svg", {viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", class: "linechart"});
      this.legend = document.createElement("div");
      this.legend.className = "legend";
      for (const s of this.series) {
        const item = document.createElement("span");
        const swatch = document.createElement("i");
        swatch.className = s.line === false ? "swatch point" : "swatch";
        // CSSOM, which the CSP allows
        if (s.line === false && s.hollow) swatch.style.border = `2px solid ${s.color}`;
        else if (s.dash) swatch.style.background = `repeating-linear-gradient(90deg, ${s.color} 0 4px, transparent 4px 7px)`;
        else swatch.style.background = s.color;
        item.append(swatch, document.createTextNode(s.label || s.name));
        this.legend.append(item);
      }
      figure.append(this.svg, this.legend);
      this.render();
    }

    set(name, points) {
      const series = this.find(name);
      series.points = new Map(points.filter((p) => p[1] !== null && p[1] !== undefined).map((p) => [p[0], p[1]]));
      this.render();
    }

    add(name, x, y) {
      if (y === null || y === undefined) return;
      this.find(name).points.set(x, y);
      this.render();
    }

    find(name) {
      const series = this.series.find((s) => s.name === name);
      if (!series) throw new Error(`no series ${name}`);
      return series;
    }

    render() {
      const svg = this.svg;
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      const all = this.series.flatMap((s) => [...s.points.entries()]);
      const longest = Math.max(0, ...this.series.map((s) => s.points.size));
      this.figure.dataset.points = String(longest);
      if (all.length === 0) {
        svg.append(el("text", {x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle", class: "placeholder"},
          this.options.empty || "no epoch finished yet"));
        return;
      }
      const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
      const xMin = this.options.xMin === undefined ? 1 : this.options.xMin;
      const xMax = Math.max(xMin + 1, this.options.xMax || 0, ...xs);
      const xLabel = this.options.xLabel || "epoch";
      let yMin = Math.min(...ys), yMax = Math.max(...ys);
      if (this.options.yMin !== undefined) yMin = Math.min(yMin, this.options.yMin);
      if (yMax - yMin < 1e-12) { yMin -= 0.5; yMax += 0.5; }
      const pad = (yMax - yMin) * 0.06;
      yMin -= pad; yMax += pad;
      if (this.options.yMin !== undefined) yMin = Math.max(yMin, this.options.yMin);
      const w = WIDTH - MARGIN.left - MARGIN.right, h = HEIGHT - MARGIN.top - MARGIN.bottom;
      const sx = (x) => MARGIN.left + ((x - xMin) / (xMax - xMin)) * w;
      const sy = (y) => MARGIN.top + (1 - (y - yMin) / (yMax - yMin)) * h;

      const grid = el("g", {class: "grid"});
      for (const t of niceTicks(yMin, yMax, 4)) {
        grid.append(el("line", {x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: sy(t), y2: sy(t)}));
        grid.append(el("text", {x: MARGIN.left - 6, y: sy(t) + 4, "text-anchor": "end"}, format(t)));
      }
      const xTicks = niceTicks(xMin, xMax, Math.min(8, xMax - xMin)).filter((t) => Number.isInteger(t));
      for (const t of xTicks) {
        grid.append(el("text", {x: sx(t), y: HEIGHT - MARGIN.bottom + 16, "text-anchor": "middle"}, String(t)));
      }
      grid.append(el("text", {x: MARGIN.left + w / 2, y: HEIGHT - 2, "text-anchor": "middle", class: "axis-label"},
        xLabel));
      svg.append(grid);

      for (const s of this.series) {
        const points = [...s.points.entries()].sort((a, b) => a[0] - b[0]);
        if (points.length === 0) continue;
        const group = el("g", {...(s.attrs || {}), class: "series", "data-series": s.name, stroke: s.color,
          fill: s.hollow ? "#fff" : s.color, "stroke-width": s.hollow ? 2 : 1});
        if (s.line !== false) {
          const d = points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
          const line = {d, fill: "none", "stroke-width": s.width || 2};
          if (s.dash) line["stroke-dasharray"] = s.dash;  // overlaid curves that coincide stay visible
          group.append(el("path", line));
        }
        for (const [x, y] of points) {
          const dot = el("circle", {cx: sx(x).toFixed(1), cy: sy(y).toFixed(1), r: s.radius || 3, [`data-${xLabel.replace(/\W+/g, "-")}`]: x});
          dot.append(el("title", {}, `${s.name}, ${xLabel} ${x}: ${format(y)}`));
          group.append(dot);
        }
        svg.append(group);
      }
    }
  }

  window.LineChart = LineChart;
})();
