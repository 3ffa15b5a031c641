// The dashboard's pages. The server renders each page's shell; this script signs in with an
// API key (kept in sessionStorage, or localStorage when asked to remember it), calls the JSON
// API with `Authorization: Bearer ...`, and follows a job's server-sent events with fetch
// (EventSource cannot send that header). Text from the API only ever goes in via textContent.
"use strict";

(function () {
  const KEY = "trainhub.apiKey";
  const FINISHED = ["succeeded", "failed", "cancelled"];
  const COLORS = {train: "#2563eb", test: "#dc2626", jax: "#7c3aed", pytorch: "#ea580c"};
  const $ = (id) => document.getElementById(id);

  // --- small helpers ----------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function replace(node, ...children) {
    node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function number(value, digits = 4) {
    if (value === null || value === undefined) return "–";
    if (Math.abs(value) >= 1000) return Math.round(value).toLocaleString("en");
    return String(+value.toPrecision(digits));
  }

  function percent(value) {
    return value === null || value === undefined ? "–" : `${(100 * value).toFixed(2)}%`;
  }

  function seconds(value) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    if (value < 60) return `${value < 10 ? value.toFixed(2) : value.toFixed(1)} s`;
    const m = Math.floor(value / 60), s = Math.round(value % 60);
    if (m < 60) return `${m}m ${String(s).padStart(2, "0")}s`;
    return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
  }

  function bytes(value) {
    const units = ["B", "KB", "MB", "GB"];
    let i = 0;
    while (value >= 1024 && i < units.length - 1) { value /= 1024; i += 1; }
    return `${i ? value.toFixed(1) : value} ${units[i]}`;
  }

  const time = (iso) => (iso ? new Date(iso).getTime() : null);

  function ago(iso) {
    const s = Math.max(0, (Date.now() - time(iso)) / 1000);
    return s < 90 ? `${Math.round(s)} s ago` : s < 5400 ? `${Math.round(s / 60)} min ago` : new Date(iso).toLocaleString();
  }

  function duration(job) {
    if (!job.started_at) return job.status === "queued" ? null : 0;
    return ((time(job.finished_at) || Date.now()) - time(job.started_at)) / 1000;
  }

  function badge(status) {
    return h("span", {class: `badge ${status}`, dataset: {status}}, status);
  }

  function progressBar(progress) {
    const fill = h("div", {class: "fill"});
    fill.style.width = `${progress.epochs ? (100 * progress.epoch) / progress.epochs : 0}%`;
    return h("span", {class: "progress"}, h("span", {class: "bar"}, fill), `${progress.epoch}/${progress.epochs}`);
  }

  function banner(text) {
    const node = $("banner");
    node.textContent = text || "";
    node.hidden = !text;
  }

  // A loop that refreshes while the tab is visible; errors show in the banner and it goes on.
  function every(ms, refresh) {
    let stopped = false;
    (async () => {
      while (!stopped) {
        if (!document.hidden) {
          try { if ((await refresh()) === false) return; banner(null); } catch (error) {
            if (error instanceof AuthError) return;
            banner(error.status ? error.message : "Cannot reach the trainhub server; retrying…");
          }
        }
        await sleep(ms);
      }
    })();
    return () => { stopped = true; };
  }

  // --- the API key and API calls -----------------------------------------------------------

  class AuthError extends Error {}

  function apiKey() {
    return sessionStorage.getItem(KEY) || localStorage.getItem(KEY);
  }

  function authHeaders(extra) {
    return {Authorization: `Bearer ${apiKey()}`, ...(extra || {})};
  }

  async function errorOf(response) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail; } catch (_) { /* not JSON */ }
    const error = new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
    error.status = response.status;
    return error;
  }

  async function checked(response) {
    if (response.status === 401) {
      forgetKey();
      showSignIn("The server refused your API key (invalid or revoked). Sign in again.");
      throw new AuthError("unauthorized");
    }
    if (!response.ok) throw await errorOf(response);
    return response;
  }

  async function api(path, options) {
    const response = await fetch(path, {...options, headers: authHeaders({Accept: "application/json"}), cache: "no-store"});
    return (await checked(response)).json();
  }

  function forgetKey() {
    sessionStorage.removeItem(KEY);
    localStorage.removeItem(KEY);
  }

  function showSignIn(message) {
    $("content").hidden = true;
    $("who").hidden = true;
    $("signin").hidden = false;
    const error = $("signin-error");
    error.textContent = message || "";
    error.hidden = !message;
    $("api-key").focus();
  }

  async function signIn(event) {
    event.preventDefault();
    const key = $("api-key").value.trim();
    const error = $("signin-error");
    error.hidden = true;
    let response;
    try {
      response = await fetch("/jobs?limit=1", {headers: {Authorization: `Bearer ${key}`}, cache: "no-store"});
    } catch (_) {
      showSignIn("Cannot reach the trainhub server.");
      return;
    }
    if (response.status === 401) {
      showSignIn("That key was refused: it is unknown, malformed or revoked.");
      return;
    }
    if (!response.ok) {
      showSignIn((await errorOf(response)).message);
      return;
    }
    forgetKey();
    ($("remember").checked ? localStorage : sessionStorage).setItem(KEY, key);
    $("api-key").value = "";
    start();
  }

  function start() {
    $("signin").hidden = true;
    $("content").hidden = false;
    $("who").hidden = false;
    $("who-key").textContent = `key ${apiKey().slice(0, 10)}…`;
    const page = PAGES[document.body.dataset.page];
    if (page) page();
  }

  // --- server-sent events over fetch -------------------------------------------------------

  function parseEvent(block) {
    const event = {id: null, event: "message", data: ""};
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "id") event.id = value;
      else if (field === "event") event.event = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return null;
    event.data = JSON.parse(data.join("\n"));
    return event;
  }

  // Follow a job's events until its final status; reconnects with Last-Event-ID, so it misses
  // nothing across a dropped connection. `onEvent` gets {id, event, data}.
  async function followEvents(jobId, onEvent, onState) {
    let lastId = null;
    for (;;) {
      try {
        const headers = authHeaders({Accept: "text/event-stream"});
        if (lastId !== null) headers["Last-Event-ID"] = lastId;
        const response = await checked(await fetch(`/jobs/${encodeURIComponent(jobId)}/events`, {headers, cache: "no-store"}));
        onState("live");
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n?/g, "\n");
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            const event = parseEvent(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
            if (!event) continue;
            if (event.id !== null) lastId = event.id;
            await onEvent(event);
            if (event.event === "status" && FINISHED.includes(event.data.status)) {
              onState("ended");
              return;
            }
          }
        }
      } catch (error) {
        if (error instanceof AuthError) return;
        if (error.status === 404) { onState("gone"); return; }
      }
      onState("reconnecting…");
      await sleep(1000);
    }
  }

  // --- the job list ------------------------------------------------------------------------

  function jobsPage() {
    const form = $("filters");
    let limit = 50;
    const filters = () => Object.fromEntries([...new FormData(form)].filter(([, v]) => v));

    form.addEventListener("change", () => {
      const query = new URLSearchParams(filters()).toString();
      history.replaceState(null, "", query ? `/?${query}` : "/");
      limit = 50;
      refresh();
    });
    $("more").addEventListener("click", () => { limit = Math.min(200, limit + 50); refresh(); });

    async function refresh() {
      const page = await api(`/jobs?${new URLSearchParams({...filters(), limit})}`);
      replace($("jobs-body"), page.items.map(jobRow));
      $("jobs-empty").hidden = page.items.length > 0;
      $("more").hidden = !page.next_cursor || limit >= 200;
      $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    }

    every(2000, refresh);
  }

  function jobRow(job) {
    const last = job.metrics.length ? job.metrics[job.metrics.length - 1] : null;
    const accuracy = job.result ? job.result.test_accuracy : last ? last.test_accuracy : null;
    const label = job.spec.name || job.id.slice(0, 8);
    return h("tr", {dataset: {jobId: job.id, status: job.status}},
      h("td", {}, h("a", {href: `/ui/jobs/${encodeURIComponent(job.id)}`, class: "job-link"}, label),
        job.spec.name ? h("span", {class: "muted small"}, ` ${job.id.slice(0, 8)}`) : null),
      h("td", {}, badge(job.status)),
      h("td", {}, job.spec.framework),
      h("td", {}, job.spec.hardware),
      h("td", {}, progressBar(job.progress)),
      h("td", {class: "num"}, percent(accuracy)),
      h("td", {class: "num"}, seconds(duration(job))),
      whyCell(job));
  }

  // Why a job waits, or why it failed (shortened; the job page has the whole message).
  function whyCell(job) {
    const text = job.waiting_reason || (job.error ? `${job.error.type}: ${job.error.message}` : "");
    return h("td", {class: job.error ? "error small" : "muted small", title: text},
      text.length > 120 ? `${text.slice(0, 117)}…` : text);
  }

  // --- one job -----------------------------------------------------------------------------

  function pairs(node, entries) {
    replace(node, entries.filter(([, v]) => v !== null && v !== undefined && v !== "")
      .flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  // The x axis runs to the last epoch so far (a 300-epoch run would squash its first points).
  function lossCharts(lossFigure, accuracyFigure) {
    return {
      loss: new window.LineChart(lossFigure, [{name: "train loss", color: COLORS.train}, {name: "test loss", color: COLORS.test}],
        {yMin: 0}),
      accuracy: new window.LineChart(accuracyFigure, [{name: "train accuracy", color: COLORS.train},
        {name: "test accuracy", color: COLORS.test}]),
    };
  }

  function epochRow(m) {
    return h("tr", {dataset: {epoch: m.epoch}},
      h("td", {class: "num"}, m.epoch), h("td", {class: "num"}, number(m.train_loss)),
      h("td", {class: "num"}, percent(m.train_accuracy)), h("td", {class: "num"}, number(m.test_loss)),
      h("td", {class: "num"}, percent(m.test_accuracy)), h("td", {class: "num"}, number(m.epoch_time_s, 3)),
      h("td", {class: "num"}, number(m.samples_per_s)));
  }

  async function jobPage() {
    const jobId = document.body.dataset.jobId;
    let job;
    try {
      job = await api(`/jobs/${encodeURIComponent(jobId)}`);
    } catch (error) {
      if (error.status === 404) {
        replace($("content"), h("h1", {}, "Job not found"),
          h("p", {}, `There is no job ${jobId} among yours. `, h("a", {href: "/"}, "Back to your jobs")));
      }
      if (!(error instanceof AuthError) && error.status !== 404) banner(error.message);
      return;
    }
    const charts = lossCharts($("loss-chart"), $("accuracy-chart"));
    const seen = new Set();
    let cancelArmed = null;

    function addEpoch(m) {
      if (seen.has(m.epoch)) return;
      seen.add(m.epoch);
      charts.loss.add("train loss", m.epoch, m.train_loss);
      charts.loss.add("test loss", m.epoch, m.test_loss);
      charts.accuracy.add("train accuracy", m.epoch, m.train_accuracy);
      charts.accuracy.add("test accuracy", m.epoch, m.test_accuracy);
      const rows = [...$("epochs-body").children, epochRow(m)].sort((a, b) => a.dataset.epoch - b.dataset.epoch);
      replace($("epochs-body"), rows);
    }

    function setProgress(progress, status) {
      $("job-progress-fill").style.width = `${progress.epochs ? (100 * progress.epoch) / progress.epochs : 0}%`;
      $("job-progress").textContent = `epoch ${progress.epoch} of ${progress.epochs}`;
      if (status) replace($("job-status"), badge(status));
    }

    function render(next) {
      job = next;
      document.title = `Job ${job.spec.name || job.id.slice(0, 8)} · ${job.status} · trainhub`;
      $("job-name").textContent = job.spec.name || "";
      setProgress(job.progress, job.status);
      job.metrics.forEach(addEpoch);
      const failed = job.status === "failed" && job.error;
      $("job-error").hidden = !failed;
      if (failed) replace($("job-error"), h("strong", {}, `Failed: ${job.error.type}`), h("br"), job.error.message);
      $("job-waiting").hidden = !job.waiting_reason;
      $("job-waiting").textContent = job.waiting_reason ? `Waiting: ${job.waiting_reason}` : "";
      $("cancel").hidden = FINISHED.includes(job.status);
      const spec = job.spec, data = spec.dataset;
      const limits = [data.train_limit && `train ${data.train_limit}`, data.test_limit && `test ${data.test_limit}`].filter(Boolean);
      pairs($("job-spec"), [
        ["framework", spec.framework], ["hardware", spec.hardware],
        ["dataset", `${data.name}${limits.length ? ` (${limits.join(", ")})` : ""}`],
        ["model", `${spec.model.name} ${JSON.stringify(spec.model.hidden_sizes)}, dropout ${spec.model.dropout}`],
        ["optimizer", `${spec.optimizer.name}, learning rate ${spec.optimizer.learning_rate}`],
        ["epochs", spec.epochs], ["batch size", spec.batch_size], ["seed", spec.seed],
        ["max runtime", spec.max_runtime_s ? seconds(spec.max_runtime_s) : null],
        ["labels", Object.keys(spec.labels || {}).length ? JSON.stringify(spec.labels) : null],
        ["created", new Date(job.created_at).toLocaleString()],
        ["started", job.started_at && new Date(job.started_at).toLocaleString()],
        ["finished", job.finished_at && new Date(job.finished_at).toLocaleString()],
        ["attempts", job.attempts],
        ["worker", job.worker && `${job.worker.hostname || job.worker.name} (${(job.worker.devices || []).join(", ")})`],
      ]);
      renderTimings();
      replace($("job-artifacts"), job.artifacts.length ? job.artifacts.map(artifactItem) :
        [h("li", {class: "muted"}, FINISHED.includes(job.status) ? "none" : "none yet (written when the job succeeds)")]);
    }

    function renderTimings() {
      const timings = Object.entries(job.timings || {}).map(([k, v]) =>
        [k.replace(/_s$/, "").replace(/_/g, " "), k.endsWith("_s") ? seconds(v) : number(v)]);
      if (job.result) timings.push(["test accuracy", percent(job.result.test_accuracy)], ["test loss", number(job.result.test_loss)]);
      if (!timings.length) {
        timings.push(job.started_at ? ["running for", seconds(duration(job))] : ["waiting for", seconds((Date.now() - time(job.created_at)) / 1000)]);
      }
      pairs($("job-timings"), timings);
    }

    function artifactItem(artifact) {
      const button = h("button", {type: "button", class: "secondary download", dataset: {artifact: artifact.name}},
        `Download ${artifact.name}`);
      button.addEventListener("click", () => download(job.id, artifact, button));
      return h("li", {}, button, h("span", {class: "muted small"}, ` ${bytes(artifact.size_bytes)} · sha256 ${artifact.sha256.slice(0, 12)}…`));
    }

    $("cancel").addEventListener("click", async () => {
      const button = $("cancel");
      if (!cancelArmed) {
        button.textContent = "Click again to cancel";
        cancelArmed = setTimeout(() => { cancelArmed = null; button.textContent = "Cancel job"; }, 4000);
        return;
      }
      clearTimeout(cancelArmed);
      cancelArmed = null;
      button.disabled = true;
      try {
        render(await api(`/jobs/${encodeURIComponent(job.id)}/cancel`, {method: "POST"}));
      } catch (error) {
        if (!(error instanceof AuthError)) banner(`Could not cancel: ${error.message}`);
      } finally {
        button.disabled = false;
        button.textContent = "Cancel job";
      }
    });

    render(job);
    if (FINISHED.includes(job.status)) return;
    const ticker = setInterval(() => { if (!job.timings) renderTimings(); }, 1000);
    await followEvents(job.id, async (event) => {
      if (event.event === "metrics") {
        addEpoch(event.data);
        setProgress(event.data.progress, job.status === "queued" ? "running" : job.status);
      } else if (event.event === "waiting") {
        $("job-waiting").hidden = !event.data.waiting_reason;
        $("job-waiting").textContent = `Waiting: ${event.data.waiting_reason}`;
      } else if (event.event === "status" && event.data.status !== job.status) {
        render(await api(`/jobs/${encodeURIComponent(job.id)}`));
      }
    }, (state) => { $("job-live").textContent = state === "live" ? "● live" : state === "ended" ? "" : state; });
    clearInterval(ticker);
    try {
      render(await api(`/jobs/${encodeURIComponent(job.id)}`));  // the final timings and artifacts
    } catch (error) {
      if (!(error instanceof AuthError)) banner(error.message);
    }
  }

  async function download(jobId, artifact, button) {
    const label = button.textContent;
    button.disabled = true;
    try {
      const response = await checked(await fetch(
        `/jobs/${encodeURIComponent(jobId)}/artifacts/${encodeURIComponent(artifact.name)}`, {headers: authHeaders()}));
      const total = Number(response.headers.get("Content-Length")) || artifact.size_bytes;
      const reader = response.body.getReader();
      const chunks = [];
      let received = 0;
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        chunks.push(value);
        received += value.length;
        button.textContent = `Downloading ${artifact.name}… ${total ? Math.floor((100 * received) / total) : 0}%`;
      }
      const url = URL.createObjectURL(new Blob(chunks, {type: "application/octet-stream"}));
      const link = h("a", {href: url, download: artifact.name, hidden: true});
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (error) {
      if (!(error instanceof AuthError)) banner(`Download failed: ${error.message}`);
    } finally {
      button.disabled = false;
      button.textContent = label;
    }
  }

  // --- comparisons -------------------------------------------------------------------------

  function comparisonsPage() {
    every(3000, async () => {
      const items = await api("/comparisons?limit=50");
      replace($("comparisons-body"), items.map((c) => h("tr", {dataset: {comparisonId: c.id}},
        h("td", {}, h("a", {href: `/ui/comparisons/${encodeURIComponent(c.id)}`}, c.spec.name || c.id.slice(0, 8))),
        h("td", {}, badge(c.status)), h("td", {}, c.spec.dataset.name), h("td", {}, c.spec.hardware),
        h("td", {class: "num"}, c.spec.epochs),
        ...["jax", "pytorch"].map((fw) => h("td", {}, badge(c.jobs[fw].status), " ", progressBar(c.jobs[fw].progress))),
        h("td", {class: "muted"}, new Date(c.created_at).toLocaleString()))));
      $("comparisons-empty").hidden = items.length > 0;
    });
  }

  function comparisonPage() {
    const comparisonId = document.body.dataset.comparisonId;
    let charts = null;
    every(2000, async () => {
      let comparison;
      try {
        comparison = await api(`/comparisons/${encodeURIComponent(comparisonId)}`);
      } catch (error) {
        if (error.status !== 404) throw error;
        replace($("content"), h("h1", {}, "Comparison not found"),
          h("p", {}, `There is no comparison ${comparisonId} among yours. `, h("a", {href: "/ui/comparisons"}, "Back")));
        return false;
      }
      const spec = comparison.spec;
      replace($("comparison-status"), badge(comparison.status));
      $("comparison-spec").textContent = `${spec.name ? `${spec.name}: ` : ""}${spec.dataset.name}, MLP ` +
        `${JSON.stringify(spec.model.hidden_sizes)}, ${spec.epochs} epochs, batch ${spec.batch_size}, on ${spec.hardware}`;
      if (!charts) {
        // JAX wide and solid under PyTorch dashed: when both trained the same, both still show.
        const series = () => [{name: "JAX", color: COLORS.jax, width: 4}, {name: "PyTorch", color: COLORS.pytorch, dash: "7 5"}];
        charts = {
          train: new window.LineChart($("train-loss-chart"), series(), {yMin: 0}),
          test: new window.LineChart($("test-loss-chart"), series(), {yMin: 0}),
        };
      }
      for (const [fw, name] of [["jax", "JAX"], ["pytorch", "PyTorch"]]) {
        const job = comparison.jobs[fw];
        charts.train.set(name, job.metrics.map((m) => [m.epoch, m.train_loss]));
        charts.test.set(name, job.metrics.map((m) => [m.epoch, m.test_loss]));
        replace($(`side-${fw}`), h("h2", {}, name),
          h("p", {}, badge(job.status), " ", progressBar(job.progress)),
          h("p", {}, h("a", {href: `/ui/jobs/${encodeURIComponent(job.id)}`}, `job ${job.id.slice(0, 8)}`)),
          job.waiting_reason ? h("p", {class: "muted"}, `Waiting: ${job.waiting_reason}`) : null,
          job.result ? h("p", {}, `test accuracy ${percent(job.result.test_accuracy)}`) : null);
      }
      const error = comparison.error;
      $("comparison-error").hidden = !error;
      if (error) $("comparison-error").textContent = `${error.framework ? `${error.framework}: ` : ""}${error.type}: ${error.message}`;
      const parity = comparison.parity;
      $("comparison-parity").hidden = !parity;
      if (parity) {
        $("comparison-parity").className = `box ${parity.passed ? "ok" : "error"}`;
        $("comparison-parity").textContent = parity.message || (parity.passed ? "parity check passed" : "parity check failed");
      }
      const rows = comparison.table || [];
      replace($("side-by-side-body"), rows.map((row) => h("tr", {dataset: {metric: row.metric}},
        h("th", {}, row.metric), h("td", {class: "num"}, number(row.pytorch)), h("td", {class: "num"}, number(row.jax)),
        h("td", {class: "num"}, number(row.ratio, 3)))));
      $("side-by-side-note").hidden = rows.length > 0;
      $("overlap-note").hidden = !comparison.overlap_s;
      $("overlap-note").textContent = comparison.overlap_s ? `The two jobs ran at the same time for ${number(comparison.overlap_s, 3)} s: ` +
        "on one host, their timings include that contention." : "";
      return !FINISHED.includes(comparison.status);
    });
  }

  // --- workers and queues ------------------------------------------------------------------

  function workersPage() {
    every(3000, async () => {
      const fleet = await api("/workers");
      replace($("queues-body"), fleet.queues.map((q) => h("tr", {dataset: {queue: q.name}},
        h("td", {}, h("code", {}, q.name)), h("td", {class: "num"}, q.depth), h("td", {class: "num"}, q.workers_online),
        h("td", {class: "muted"}, q.depth && !q.workers_online ? "no online worker serves it: jobs wait" : ""))));
      replace($("workers-body"), fleet.workers.map((w) => h("tr", {dataset: {worker: w.name, online: w.online}},
        h("td", {}, h("span", {class: `dot ${w.online ? "online" : "offline"}`, title: w.online ? "online" : "offline"}),
          w.online ? " online" : " offline"),
        h("td", {}, w.name), h("td", {}, w.hardware), h("td", {}, w.queues.join(", ")), h("td", {}, w.devices.join(", ")),
        h("td", {class: "small"}, Object.entries(w.versions).map(([k, v]) => `${k} ${v}`).join(" · ")),
        h("td", {}, w.current_job_id ? h("a", {href: `/ui/jobs/${encodeURIComponent(w.current_job_id)}`}, w.current_job_id.slice(0, 8))
          : w.busy ? "busy" : w.online ? "idle" : ""),
        h("td", {class: "muted"}, ago(w.last_seen)))));
      $("workers-empty").hidden = fleet.workers.length > 0;
    });
  }

  const PAGES = {jobs: jobsPage, job: jobPage, comparisons: comparisonsPage, comparison: comparisonPage, workers: workersPage};

  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => { forgetKey(); window.location.reload(); });
    if (apiKey()) start(); else showSignIn();
  });
})();
