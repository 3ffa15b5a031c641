// The dashboard's pages. The server renders each page's shell; this script signs in with an
// API key (kept in sessionStorage, or localStorage when asked to remember it), calls the JSON
// API with `Authorization: Bearer ...`, and follows a job's server-sent events with fetch
// (EventSource cannot send that header). Text from the API only ever goes in via textContent.
"use strict";

(function () {
  const KEY = "trainhub.apiKey";
  const FINISHED = ["succeeded", "failed", "cancelled", "pruned"];
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

  const given = (value) => value !== null && value !== undefined;

  // [28, 28, 1] -> "28×28×1"; a table's [30] -> "30".
  const shape = (dims) => (dims || []).join("×");

  function modelText(model) {
    if (model.layers) {
      // A list of the user's own: its layers' types, residuals in brackets.
      const types = (layers) =>
        layers.map((l) => (l.type === "residual" ? `residual[${types(l.layers).join(" → ")}]` : l.type));
      return `layers: ${types(model.layers).join(" → ")}`;
    }
    if (model.name === "lenet5" || model.name === "resnet8") return model.name;
    const dense = JSON.stringify(model.hidden_sizes);
    const layers = model.name === "cnn" ? `CNN conv ${JSON.stringify(model.channels)}, dense ${dense}` : `MLP ${dense}`;
    return `${layers}${model.batch_norm ? ", batch norm" : ""}${model.dropout ? `, dropout ${model.dropout}` : ""}`;
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
    // FastAPI's 422 detail is a list of {loc, msg}: say each field and what is wrong with it
    const fields = Array.isArray(detail) ? detail.map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`) : null;
    const error = new Error(typeof detail === "string" ? detail : fields ? fields.join("; ") : JSON.stringify(detail));
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

  // Every item of a paged list (GET /datasets...), following next_cursor page after page.
  async function allItems(path) {
    const items = [];
    let cursor = null;
    do {
      const page = await api(`${path}?limit=200${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
      items.push(...page.items);
      cursor = page.next_cursor;
    } while (cursor);
    return items;
  }

  // A list shown a page at a time, newest first. The page's cursor is in the URL (?cursor=), so
  // Back, reload and a shared link come back to the same page; "Older" follows the page's
  // next_cursor, "Newest" returns to the first page. ?limit= sets the page size (1..most).
  // `list`: {path, prepare(items) (async, optional), render(items), filters() and restore()
  // (optional: more query parameters, read from the page's form, and the form set from the URL)}.
  function pager(size, most, list) {
    const param = (name) => new URLSearchParams(location.search).get(name);
    let next = null;
    let shown = 0;  // the latest refresh asked for: an earlier one's late answer is dropped
    function go(cursor) {
      const query = new URLSearchParams(location.search);
      if (cursor) query.set("cursor", cursor); else query.delete("cursor");
      if (query.toString() !== new URLSearchParams(location.search).toString()) {  // a double click: one entry
        history.pushState(null, "", query.toString() ? `?${query}` : location.pathname);
      }
      now();
    }
    async function refresh() {
      const asked = ++shown;
      const cursor = param("cursor");
      const limit = Math.min(most, parseInt(param("limit"), 10) >= 1 ? parseInt(param("limit"), 10) : size);
      $("newest").hidden = !cursor;  // a way back to the first page, even when this one fails
      const filters = list.filters ? list.filters() : {};
      let page;
      try {
        page = await api(`${list.path}?${new URLSearchParams({...filters, limit, ...(cursor ? {cursor} : {})})}`);
      } catch (error) {
        if (error.status !== 422 || !cursor) throw error;
        throw Object.assign(new Error("This page's link holds a cursor the server did not hand out (edited?): click "
          + "Newest."), {status: error.status});
      }
      if (list.prepare) await list.prepare(page.items);
      if (asked !== shown) return;
      list.render(page.items);
      next = page.next_cursor;
      $("older").hidden = !next;
    }
    // A refresh the user asked for (a click, Back): its error shows at once, not at the next tick.
    const now = () => refresh().then(() => banner(null), (error) => {
      if (!(error instanceof AuthError)) banner(error.message);
    });
    $("older").addEventListener("click", () => next && go(next));
    $("newest").addEventListener("click", () => go(null));
    addEventListener("popstate", () => { if (list.restore) list.restore(); now(); });
    return {refresh, now};
  }

  // --- datasets and scores in labels -------------------------------------------------------

  // A spec names a built-in dataset by name and an uploaded one by id only. The names of the
  // key's uploads come from GET /datasets: fetched once, and again (at most every 30 s) when a
  // label needs an id not seen yet (a new upload; a deleted one stays its short id).
  const uploadedNames = new Map();
  let namesFetched = 0;

  async function learnDatasetNames(specs) {
    const unknown = specs.some((spec) => spec.dataset.id && !uploadedNames.has(spec.dataset.id));
    if (!unknown || Date.now() - namesFetched < 30000) return;
    namesFetched = Date.now();
    try {
      for (const dataset of await allItems("/datasets")) if (dataset.id) uploadedNames.set(dataset.id, dataset.name);
    } catch (_) {
      // the labels make do with short ids (a refused key has shown the sign-in already)
    }
  }

  const shortId = (id) => id.slice(0, 11);  // "ds_" and 8 hex digits
  const datasetHref = (data) => `/ui/datasets/${encodeURIComponent(data.id || data.name)}`;

  // A spec's dataset as a link to its page: a built-in one by name; an uploaded one by its name
  // (when known) and short id.
  function datasetLabel(data) {
    if (!data.id) return h("a", {href: datasetHref(data), class: "dataset-link", dataset: {dataset: data.name}}, data.name);
    const name = uploadedNames.get(data.id);
    return h("span", {}, h("a", {href: datasetHref(data), class: "dataset-link", title: data.id, dataset: {datasetId: data.id}},
      name || shortId(data.id)), name ? h("span", {class: "muted small"}, ` ${shortId(data.id)}`) : null);
  }

  // Regression has no accuracy: RMSE, MAE and R² instead. The dataset's info in the spec says
  // which task; metrics say it for a spec without one.
  function isRegression(spec, metrics) {
    const info = spec.dataset.info;
    if (info && info.task) return info.task === "regression";
    return (metrics || []).some((m) => !given(m.test_accuracy) && given(m.test_r2));
  }

  // The test score of a result or an epoch: accuracy, or RMSE and R² for regression.
  function scoreText(values, regression) {
    if (!values) return "–";
    if (!regression) return percent(values.test_accuracy);
    return given(values.test_rmse) ? `RMSE ${number(values.test_rmse)} · R² ${number(values.test_r2, 3)}` : "–";
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
    const filters = () => Object.fromEntries([...new FormData(form)].filter(([, v]) => v));
    const pages = pager(50, 200, {
      path: "/jobs",
      filters,
      restore() {  // Back or Forward: the filters the URL names
        const query = new URLSearchParams(location.search);
        for (const select of form.querySelectorAll("select")) select.value = query.get(select.name) || "";
      },
      prepare: (jobs) => learnDatasetNames(jobs.map((job) => job.spec)),
      render(jobs) {
        replace($("jobs-body"), jobs.map(jobRow));
        $("jobs-empty").hidden = jobs.length > 0;
        $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
      },
    });

    form.addEventListener("change", () => {  // new filters start again from the newest job
      const query = new URLSearchParams(filters());
      const limit = new URLSearchParams(location.search).get("limit");
      if (limit) query.set("limit", limit);
      history.pushState(null, "", query.toString() ? `/?${query}` : "/");
      pages.now();
    });
    every(2000, pages.refresh);
  }

  function jobRow(job) {
    const last = job.metrics.length ? job.metrics[job.metrics.length - 1] : null;
    const label = job.spec.name || job.id.slice(0, 8);
    return h("tr", {dataset: {jobId: job.id, status: job.status}},
      h("td", {}, h("a", {href: `/ui/jobs/${encodeURIComponent(job.id)}`, class: "job-link"}, label),
        job.spec.name ? h("span", {class: "muted small"}, ` ${job.id.slice(0, 8)}`) : null),
      h("td", {}, badge(job.status)),
      h("td", {}, job.spec.framework),
      h("td", {}, job.spec.hardware),
      h("td", {class: "dataset"}, datasetLabel(job.spec.dataset)),
      h("td", {}, progressBar(job.progress)),
      h("td", {class: "num score"}, scoreText(job.result || last, isRegression(job.spec, job.metrics))),
      h("td", {class: "num"}, seconds(duration(job))),
      whyCell(job));
  }

  // A failure's type from the closed list, with its finer cause: "data_error (data_not_found)".
  function failureName(error) {
    return error.reason ? `${error.type} (${error.reason})` : error.type;
  }

  // Why a job waits, or why it failed (shortened; the job page has the whole message).
  function whyCell(job) {
    const text = job.waiting_reason || (job.error ? `${failureName(job.error)}: ${job.error.message}` : "") ||
      (job.pruned ? job.pruned.reason : "");
    return h("td", {class: job.error ? "error small" : "muted small", title: text},
      text.length > 120 ? `${text.slice(0, 117)}…` : text);
  }

  // --- one job -----------------------------------------------------------------------------

  function pairs(node, entries) {
    replace(node, entries.filter(([, v]) => v !== null && v !== undefined && v !== "")
      .flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  // Per task: the score chart's caption and series (name, metric), and the epoch table's
  // columns (heading, metric, format). Regression's loss is the MSE; its score R² (1 is perfect).
  const TASKS = {
    classification: {
      caption: "Accuracy per epoch",
      series: [["train accuracy", "train_accuracy", COLORS.train], ["test accuracy", "test_accuracy", COLORS.test]],
      columns: [["train loss", "train_loss", number], ["train accuracy", "train_accuracy", percent],
        ["test loss", "test_loss", number], ["test accuracy", "test_accuracy", percent]],
    },
    regression: {
      caption: "Test R² per epoch",
      series: [["test R²", "test_r2", COLORS.test]],
      columns: [["train loss (MSE)", "train_loss", number], ["test loss (MSE)", "test_loss", number],
        ["test RMSE", "test_rmse", number], ["test MAE", "test_mae", number], ["test R²", "test_r2", (v) => number(v, 3)]],
    },
  };

  // The x axis runs to the last epoch so far (a 300-epoch run would squash its first points).
  function jobCharts(lossFigure, scoreFigure, task) {
    scoreFigure.dataset.metric = task.series.map(([, metric]) => metric).join(" ");
    scoreFigure.querySelector("figcaption").textContent = task.caption;
    return {
      loss: new window.LineChart(lossFigure, [{name: "train loss", color: COLORS.train}, {name: "test loss", color: COLORS.test}],
        {yMin: 0}),
      score: new window.LineChart(scoreFigure, task.series.map(([name, , color]) => ({name, color}))),
    };
  }

  function epochHead(task) {
    return h("tr", {}, [["epoch"], ...task.columns, ["epoch s"], ["samples/s"]].map(([heading]) => h("th", {class: "num"}, heading)));
  }

  function epochRow(m, task) {
    return h("tr", {dataset: {epoch: m.epoch}},
      h("td", {class: "num"}, m.epoch),
      task.columns.map(([, metric, format]) => h("td", {class: "num", dataset: {metric}}, format(m[metric]))),
      h("td", {class: "num"}, number(m.epoch_time_s, 3)), h("td", {class: "num"}, number(m.samples_per_s)));
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
    await learnDatasetNames([job.spec]);
    const regression = isRegression(job.spec, job.metrics);
    const task = TASKS[regression ? "regression" : "classification"];
    const charts = jobCharts($("loss-chart"), $("accuracy-chart"), task);
    replace($("epochs-head"), epochHead(task));
    const seen = new Set();
    let cancelArmed = null;

    function addEpoch(m) {
      if (seen.has(m.epoch)) return;
      seen.add(m.epoch);
      charts.loss.add("train loss", m.epoch, m.train_loss);
      charts.loss.add("test loss", m.epoch, m.test_loss);
      for (const [name, metric] of task.series) charts.score.add(name, m.epoch, m[metric]);
      const rows = [...$("epochs-body").children, epochRow(m, task)].sort((a, b) => a.dataset.epoch - b.dataset.epoch);
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
      if (failed) replace($("job-error"), h("strong", {}, `Failed: ${failureName(job.error)}`), h("br"), job.error.message);
      $("job-waiting").hidden = !job.waiting_reason;
      $("job-waiting").textContent = job.waiting_reason ? `Waiting: ${job.waiting_reason}` : "";
      // A job the retry policy sent back: which failure, how often (while queued the waiting hint says it).
      const retried = job.retries > 0 && job.last_error && job.status !== "queued";
      $("job-retried").hidden = !retried;
      $("job-retried").textContent = retried ?
        `Retried ${job.retries} time${job.retries === 1 ? "" : "s"}; last after ${failureName(job.last_error)}: ${job.last_error.message}` : "";
      renderTrial();
      $("job-pruned").hidden = !job.pruned;
      if (job.pruned) {
        replace($("job-pruned"), h("strong", {}, `Pruned after epoch ${job.pruned.epoch}`), h("br"), job.pruned.reason);
      }
      $("cancel").hidden = FINISHED.includes(job.status);
      const spec = job.spec, data = spec.dataset, info = data.info;
      const details = [data.train_limit && `train ${data.train_limit}`, data.test_limit && `test ${data.test_limit}`,
        given(data.validation_split) && `validation split ${data.validation_split}`, data.standardize && "standardized"];
      const shown = details.filter(Boolean);
      pairs($("job-spec"), [
        ["framework", spec.framework], ["hardware", spec.hardware],
        ["dataset", h("span", {id: "job-dataset"}, datasetLabel(data), shown.length ? ` (${shown.join(", ")})` : "")],
        ["task", info ? `${info.task}, input ${shape(info.input_shape)}` +
          `${info.num_classes ? `, ${info.num_classes} classes` : ""}, ${info.train_size} train / ${info.test_size} test` : null],
        ["model", modelText(spec.model) + (job.model ? ` (${job.model.parameters.toLocaleString()} parameters, ` +
          `${job.model.flops_per_example.toLocaleString()} FLOPs an example)` : "")],
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

    // A sweep's trial: "trial N of sweep NAME" linking to the sweep, and the values it set.
    let sweepName = null;
    function renderTrial() {
      const trial = job.sweep;
      $("job-trial").hidden = !trial;
      if (!trial) return;
      replace($("job-trial"), `Trial ${trial.trial} of sweep `,
        h("a", {href: sweepHref(trial.id), id: "job-sweep-link"}, sweepName || trial.id.slice(0, 8)),
        Object.keys(trial.params).length ? h("span", {class: "muted"}, " · ", Object.entries(trial.params)
          .map(([name, value]) => `${name} = ${paramText(value)}`).join(", ")) : null);
      if (sweepName === null) {
        sweepName = "";
        api(`/sweeps/${encodeURIComponent(trial.id)}`).then((sweep) => {
          sweepName = sweep.name || "";
          if (sweepName) $("job-sweep-link").textContent = sweepName;
        }).catch(() => { /* the short id does */ });
      }
    }

    function renderTimings() {
      const timings = Object.entries(job.timings || {}).map(([k, v]) =>
        [k.replace(/_s$/, "").replace(/_/g, " "), k.endsWith("_s") ? seconds(v) : number(v)]);
      const result = job.result;
      if (result && regression) {
        timings.push(["test RMSE", number(result.test_rmse)], ["test MAE", number(result.test_mae)],
          ["test R²", number(result.test_r2, 3)], ["test loss (MSE)", number(result.test_loss)]);
      } else if (result) {
        timings.push(["test accuracy", percent(result.test_accuracy)], ["test loss", number(result.test_loss)]);
      }
      if (!timings.length) {
        timings.push(job.started_at ? [FINISHED.includes(job.status) ? "ran for" : "running for", seconds(duration(job))] : ["waiting for", seconds((Date.now() - time(job.created_at)) / 1000)]);
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
    every(3000, pager(50, 100, {path: "/comparisons", prepare: (items) => learnDatasetNames(items.map((c) => c.spec)),
      render(items) {
      replace($("comparisons-body"), items.map((c) => h("tr", {dataset: {comparisonId: c.id}},
        h("td", {}, h("a", {href: `/ui/comparisons/${encodeURIComponent(c.id)}`}, c.spec.name || c.id.slice(0, 8))),
        h("td", {}, badge(c.status)), h("td", {class: "dataset"}, datasetLabel(c.spec.dataset)), h("td", {}, c.spec.hardware),
        h("td", {class: "num"}, c.spec.epochs),
        ...["jax", "pytorch"].map((fw) => h("td", {}, badge(c.jobs[fw].status), " ", progressBar(c.jobs[fw].progress))),
        h("td", {class: "muted"}, new Date(c.created_at).toLocaleString()))));
      $("comparisons-empty").hidden = items.length > 0;
    }}).refresh);
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
      await learnDatasetNames([spec]);
      const regression = isRegression(spec, Object.values(comparison.jobs).flatMap((job) => job.metrics));
      replace($("comparison-status"), badge(comparison.status));
      replace($("comparison-spec"), spec.name ? `${spec.name}: ` : "", datasetLabel(spec.dataset),
        `, ${modelText(spec.model)}, ${spec.epochs} epochs, batch ${spec.batch_size}, on ${spec.hardware}`);
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
          job.result ? h("p", {class: "score"}, regression ? `test ${scoreText(job.result, true)}`
            : `test accuracy ${percent(job.result.test_accuracy)}`) : null);
      }
      const error = comparison.error;
      $("comparison-error").hidden = !error;
      if (error) $("comparison-error").textContent = `${error.framework ? `${error.framework}: ` : ""}${failureName(error)}: ${error.message}`;
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

  // --- datasets ----------------------------------------------------------------------------

  const classesText = (d) => (d.task === "regression" ? "–" : d.num_classes);

  function datasetsPage() {
    every(5000, async () => {
      const items = await allItems("/datasets");
      const builtIn = items.filter((d) => d.built_in), uploaded = items.filter((d) => !d.built_in);
      for (const d of uploaded) uploadedNames.set(d.id, d.name);
      const sizes = (d) => [h("td", {class: "num"}, d.train_size.toLocaleString("en")),
        h("td", {class: "num"}, d.test_size ? d.test_size.toLocaleString("en") : "none")];
      replace($("built-in-body"), builtIn.map((d) => h("tr", {dataset: {dataset: d.name}},
        h("td", {}, h("a", {href: datasetHref(d), class: "dataset-link"}, d.name)), h("td", {}, d.task),
        h("td", {}, shape(d.input_shape)), h("td", {class: "num"}, classesText(d)), ...sizes(d))));
      $("built-in-empty").hidden = builtIn.length > 0;
      replace($("datasets-body"), uploaded.map((d) => h("tr", {dataset: {datasetId: d.id}},
        h("td", {}, h("a", {href: datasetHref(d), class: "dataset-link"}, d.name)),
        h("td", {}, h("code", {title: d.id}, shortId(d.id))), h("td", {}, d.format), h("td", {}, d.task),
        h("td", {}, shape(d.input_shape)), h("td", {class: "num"}, classesText(d)), ...sizes(d),
        h("td", {class: "num"}, bytes(d.bytes)), h("td", {class: "muted"}, new Date(d.created_at).toLocaleString()))));
      $("datasets-empty").hidden = uploaded.length > 0;
    });
  }

  // One dataset: by id (ds_...) an uploaded one, by name a built-in one (GET /datasets lists those).
  async function datasetPage() {
    const key = document.body.dataset.datasetId;
    let dataset;
    try {
      dataset = key.startsWith("ds_") ? await api(`/datasets/${encodeURIComponent(key)}`)
        : (await api("/datasets?limit=1")).items.find((d) => d.built_in && d.name === key);  // on the first page
    } catch (error) {
      if (error instanceof AuthError) return;
      if (error.status !== 404) { banner(error.message); return; }
    }
    if (!dataset) {
      replace($("content"), h("h1", {}, "Dataset not found"),
        h("p", {}, `There is no dataset ${key} among yours or this server's built-in ones (a deleted dataset's jobs ` +
          "keep its sha256 in their spec). ", h("a", {href: "/ui/datasets"}, "Back to the datasets")));
      return;
    }
    const d = dataset;
    document.title = `Dataset ${d.name} · trainhub`;
    $("dataset-name").textContent = d.name;
    $("dataset-id").textContent = d.id || "built in";
    $("dataset-kind").textContent = d.built_in ? "built in" : "uploaded";
    pairs($("dataset-fields"), [
      ["name", d.name], ["id", d.id], ["format", d.format], ["task", d.task], ["input shape", shape(d.input_shape)],
      ["classes", d.task === "regression" ? null : d.num_classes],
      ["train examples", d.train_size.toLocaleString("en")],
      ["test examples", d.test_size ? d.test_size.toLocaleString("en") : "none: jobs set dataset.validation_split"],
      ["stored", given(d.bytes) ? `${bytes(d.bytes)} (${d.bytes.toLocaleString("en")} bytes)` : null],
      ["uploaded", given(d.upload_bytes) ? `${bytes(d.upload_bytes)} (${d.upload_bytes.toLocaleString("en")} bytes)` : null],
      ["sha256", d.sha256 ? h("code", {}, d.sha256) : null],
      ["created", d.created_at && new Date(d.created_at).toLocaleString()],
      ["train on it", h("code", {}, `trainhub submit --dataset ${d.id || d.name}${d.test_size ? "" : " --validation-split 0.2"}`)],
    ]);
    const names = d.class_names && d.class_names.length ? d.class_names
      : Array.from({length: d.num_classes || 0}, (_, i) => String(i));
    replace($("dataset-classes"), names.map((name, i) => h("li", {dataset: {label: i}}, name)));
    $("dataset-no-classes").hidden = names.length > 0;
    $("dataset-no-classes").textContent = d.task === "regression" ? "None: a regression dataset (one target value per example)." : "";

    const deleteButton = $("delete");
    deleteButton.hidden = d.built_in;
    let armed = null;
    deleteButton.addEventListener("click", async () => {
      if (!armed) {
        deleteButton.textContent = "Click again to delete";
        armed = setTimeout(() => { armed = null; deleteButton.textContent = "Delete dataset"; }, 4000);
        return;
      }
      clearTimeout(armed);
      armed = null;
      deleteButton.disabled = true;
      try {
        await checked(await fetch(`/datasets/${encodeURIComponent(d.id)}`, {method: "DELETE", headers: authHeaders()}));
        window.location.assign("/ui/datasets");
      } catch (error) {
        if (!(error instanceof AuthError)) banner(`Could not delete: ${error.message}`);
      } finally {
        deleteButton.disabled = false;
        deleteButton.textContent = "Delete dataset";
      }
    });

    // The key's latest jobs (the API has no dataset filter) that name this dataset.
    const uses = (job) => (d.id ? job.spec.dataset.id === d.id : job.spec.dataset.name === d.name);
    every(5000, async () => {
      const jobs = (await api("/jobs?limit=200")).items.filter(uses);
      replace($("dataset-jobs-body"), jobs.map(jobRow));
      $("dataset-jobs-empty").hidden = jobs.length > 0;
    });
  }

  // --- sweeps ------------------------------------------------------------------------------

  const SWEEP_ENDED = ["succeeded", "failed", "cancelled"];
  // Distinct colours for the trials' curves; pruned ones grey and dashed, failed ones red and dashed.
  const PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#7c3aed", "#db2777", "#0891b2", "#ca8a04", "#4f46e5",
    "#059669", "#9333ea"];
  const PRUNED_COLOR = "#98a2b3", FAILED_COLOR = "#f04438";
  const sweepHref = (id) => `/ui/sweeps/${encodeURIComponent(id)}`;
  const jobHref = (id) => `/ui/jobs/${encodeURIComponent(id)}`;

  // An objective value the way its metric reads: accuracies as percentages.
  function objectiveText(metric, value) {
    if (!given(value)) return "–";
    if (metric.endsWith("accuracy")) return percent(value);
    return number(value, metric.endsWith("r2") ? 3 : 4);
  }

  // A searched value: small or large floats in exponent form (learning rates), others as they are.
  function paramText(value) {
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return String(value);
    const abs = Math.abs(value);
    return abs !== 0 && (abs < 1e-3 || abs >= 1e5) ? value.toExponential(2) : String(+value.toPrecision(4));
  }

  function dimensionText(dimension) {
    const [kind, values] = Object.entries(dimension).find(([, v]) => given(v));
    return kind.endsWith("uniform") ? `${kind} [${values.map(paramText).join(", ")}]`
      : `${kind} {${values.map(paramText).join(", ")}}`;
  }

  const ended = (trials) => ["succeeded", "pruned", "failed", "cancelled"].reduce((n, k) => n + trials[k], 0);

  // How many trials the sweep means to run: max_trials, or a smaller grid's size (a cancel or a
  // spent max_total_s stops it short: its progress then stays short of the end).
  function plannedTrials(sweep) {
    const spec = sweep.spec;
    if (spec.method !== "grid") return spec.max_trials;
    const size = Object.values(spec.space).reduce((n, d) => n * ((d.grid || d.choice || []).length || 1), 1);
    return Math.min(spec.max_trials, size);
  }

  function trialsProgress(sweep) {
    const done = ended(sweep.trials), total = plannedTrials(sweep);
    const fill = h("div", {class: "fill"});
    fill.style.width = `${total ? Math.min(100, (100 * done) / total) : 0}%`;
    return h("span", {class: "progress"}, h("span", {class: "bar"}, fill), `${done}/${total}`);
  }

  function sweepSummary(sweep) {
    const spec = sweep.spec, base = spec.base, stopping = spec.early_stopping;
    const frameworks = spec.frameworks || [base.framework || "jax"];
    return [`${spec.method} search over ${Object.keys(spec.space).join(", ")} · ${frameworks.join(" and ")} on `,
      base.dataset ? datasetLabel(base.dataset) : "?", `${given(base.epochs) ? `, ${base.epochs} epochs` : ""}`,
      ` · objective ${spec.objective.metric} (${spec.objective.direction})`,
      stopping ? ` · early stopping ${stopping.method} from epoch ${stopping.min_epochs}` +
        `${stopping.method === "asha" ? `, reduction factor ${stopping.reduction_factor}` : ""}` : " · no early stopping"];
  }

  function sweepsPage() {
    every(3000, pager(50, 100, {path: "/sweeps",
      prepare: (items) => learnDatasetNames(items.map((s) => s.spec.base).filter((b) => b.dataset)),
      render(items) {
      replace($("sweeps-body"), items.map((sweep) => {
        const metric = sweep.spec.objective.metric;
        return h("tr", {dataset: {sweepId: sweep.id, status: sweep.status}},
          h("td", {}, h("a", {href: sweepHref(sweep.id), class: "sweep-link"}, sweep.name || sweep.id.slice(0, 8)),
            sweep.name ? h("span", {class: "muted small"}, ` ${sweep.id.slice(0, 8)}`) : null),
          h("td", {}, badge(sweep.status)),
          h("td", {class: "dataset"}, sweep.spec.base.dataset ? datasetLabel(sweep.spec.base.dataset) : "?"),
          h("td", {}, sweep.spec.method, sweep.spec.early_stopping ? h("span", {class: "muted small"},
            ` · ${sweep.spec.early_stopping.method}`) : null),
          h("td", {class: "trials"}, trialsProgress(sweep)),
          h("td", {class: "num"}, sweep.trials.running),
          h("td", {class: "num"}, sweep.trials.pruned),
          h("td", {class: "num best", title: metric}, sweep.best ? `${objectiveText(metric, sweep.best.objective)} ` : "–",
            sweep.best ? h("span", {class: "muted small"}, `trial ${sweep.best.number}`) : null),
          h("td", {class: "muted"}, new Date(sweep.created_at).toLocaleString()));
      }));
      $("sweeps-empty").hidden = items.length > 0;
      $("sweeps-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    }}).refresh);
  }

  // Best first: the completed trials by objective, then running, then pruned (those that got
  // further first), then failed or cancelled, then queued.
  const STANDING = {succeeded: 0, running: 1, pruned: 2, failed: 3, cancelled: 3, queued: 4};

  function bestFirst(trials, direction) {
    const sign = direction === "min" ? 1 : -1;
    const score = (t) => (given(t.objective) ? sign * t.objective : Infinity);
    return [...trials].sort((a, b) => (STANDING[a.status] ?? 5) - (STANDING[b.status] ?? 5)
      || (a.status === "pruned" ? b.epochs - a.epochs : 0) || score(a) - score(b) || a.number - b.number);
  }

  const trialJobs = (trial) => Object.entries(trial.jobs || {}).length ? trial.jobs : {job: trial.job_id};

  function sweepPage() {
    const sweepId = document.body.dataset.sweepId;
    const metricsOf = new Map();  // job id -> its per-epoch metrics as last fetched
    let charts = {trials: null, epochs: null, trialsKey: "", epochsKey: ""};
    let cancelArmed = null;

    // A trial's objective per epoch: its job's metric, or the mean of its jobs' (both frameworks).
    function objectivePerEpoch(trial, metric) {
      const runs = Object.values(trialJobs(trial)).map((id) => metricsOf.get(id) || []);
      const byEpoch = runs.map((rows) => new Map(rows.filter((m) => given(m[metric])).map((m) => [m.epoch, m[metric]])));
      return [...byEpoch[0].keys()].filter((e) => byEpoch.every((m) => m.has(e))).sort((a, b) => a - b)
        .map((e) => [e, byEpoch.reduce((sum, m) => sum + m.get(e), 0) / byEpoch.length]);
    }

    // Fetch the metrics of the trials whose epochs moved since the last fetch, a few at a time.
    async function fetchMetrics(trials) {
      const stale = trials.flatMap((t) => Object.values(trialJobs(t)).filter((id) =>
        t.epochs > 0 && (!metricsOf.has(id) || metricsOf.get(id).length < t.epochs || t.status === "running")));
      for (let i = 0; i < stale.length; i += 6) {
        await Promise.all(stale.slice(i, i + 6).map(async (id) => {
          metricsOf.set(id, await api(`/jobs/${encodeURIComponent(id)}/metrics`));
        }));
      }
    }

    function trialStyle(trial, best) {
      if (trial.status === "pruned") return {color: PRUNED_COLOR, dash: "5 4", width: 1.5};
      if (trial.status === "failed" || trial.status === "cancelled") return {color: FAILED_COLOR, dash: "2 3", width: 1.5};
      return {color: PALETTE[trial.number % PALETTE.length], width: best && best.number === trial.number ? 3.5 : 2};
    }

    // (Re)build a chart when its series change (new trials, new statuses); else update its points.
    function chart(which, figure, key, series, options) {
      if (charts[which] && charts[`${which}Key`] === key) return charts[which];
      figure.querySelectorAll("svg, .legend").forEach((node) => node.remove());
      charts[which] = new window.LineChart(figure, series, options);
      charts[`${which}Key`] = key;
      return charts[which];
    }

    function renderCharts(sweep, trials) {
      const metric = sweep.spec.objective.metric, best = sweep.best;
      // The objective per trial: a scatter, one series per outcome.
      const outcomes = [
        ["best", "best", {color: "#15803d", radius: 6}],
        ["succeeded", "succeeded", {color: "#2563eb", radius: 4}],
        ["running", "running", {color: "#1d4ed8", radius: 4, hollow: true}],
        ["pruned", "pruned", {color: PRUNED_COLOR, radius: 4, hollow: true}],
        ["failed", "failed or cancelled", {color: FAILED_COLOR, radius: 4, hollow: true}],
      ];
      const outcomeOf = (t) => (best && t.number === best.number ? "best"
        : t.status === "cancelled" ? "failed" : t.status);
      const scored = trials.filter((t) => given(t.objective));
      const present = outcomes.filter(([name]) => scored.some((t) => outcomeOf(t) === name));
      const perTrial = chart("trials", $("trials-chart"), present.map(([name]) => name).join(),
        present.map(([name, label, style]) => ({name, label, line: false, attrs: {"data-outcome": name}, ...style})),
        // The x axis spans the whole budget, when that leaves room to tell the points apart.
        {xMin: 0, xMax: plannedTrials(sweep) <= 50 ? plannedTrials(sweep) - 1 : 1, xLabel: "trial",
          empty: "no trial has an objective yet"});
      for (const [name] of present) {
        perTrial.set(name, scored.filter((t) => outcomeOf(t) === name).map((t) => [t.number, t.objective]));
      }
      $("trials-chart").dataset.trials = String(scored.length);

      // The objective per epoch: one line per trial, in trial order.
      const ordered = [...trials].sort((a, b) => a.number - b.number).filter((t) => t.epochs > 0);
      const epochs = Math.max(given(sweep.spec.base.epochs) ? sweep.spec.base.epochs : 2,
        ...ordered.map((t) => t.epochs));
      const key = ordered.map((t) => `${t.number}:${t.status}`).join() + (best ? `|${best.number}` : "");
      const perEpoch = chart("epochs", $("epochs-chart"), key, ordered.map((t) => ({
        name: `trial ${t.number}`, label: `trial ${t.number}${t.status === "pruned" ? " (pruned)" : ""}`,
        attrs: {"data-trial": t.number, "data-status": t.status}, ...trialStyle(t, best),
      })), {xMax: epochs, empty: "no trial finished an epoch yet"});
      for (const t of ordered) perEpoch.set(`trial ${t.number}`, objectivePerEpoch(t, metric));
      $("epochs-chart").dataset.trials = String(ordered.length);
    }

    function trialRow(trial, sweep, names) {
      const metric = sweep.spec.objective.metric;
      const isBest = sweep.best && sweep.best.number === trial.number;
      const jobs = trialJobs(trial);
      const total = given(sweep.spec.base.epochs) ? `/${sweep.spec.base.epochs}` : "";
      return h("tr", {class: `trial ${trial.status}${isBest ? " best" : ""}`,
        dataset: {trial: trial.number, status: trial.status, jobId: trial.job_id}},
        h("td", {class: "num"}, trial.number),
        h("td", {class: "status"}, badge(trial.status), isBest ? h("span", {class: "badge best"}, "best") : null,
          given(trial.pruned_at_epoch) ? h("span", {class: "muted small"}, ` after epoch ${trial.pruned_at_epoch}`) : null),
        names.map((name) => h("td", {class: "num", dataset: {param: name}}, given(trial.params[name]) ? paramText(trial.params[name]) : "–")),
        h("td", {class: "num epochs"}, `${trial.epochs}${total}`),
        h("td", {class: "num objective"}, objectiveText(metric, trial.objective)),
        h("td", {class: "jobs"}, Object.entries(jobs).flatMap(([fw, id], i, all) => [i ? " · " : null,
          h("a", {href: jobHref(id), class: "job-link", dataset: {framework: fw}},
            all.length === 1 ? `job ${id.slice(0, 8)}` : fw)]),
          trial.comparison_id ? [" · ", h("a", {href: `/ui/comparisons/${encodeURIComponent(trial.comparison_id)}`},
            "comparison")] : null));
    }

    function render(sweep, trials) {
      const spec = sweep.spec, metric = spec.objective.metric, names = Object.keys(spec.space);
      document.title = `Sweep ${sweep.name || sweep.id.slice(0, 8)} · ${sweep.status} · trainhub`;
      $("sweep-name").textContent = sweep.name || "";
      replace($("sweep-status"), badge(sweep.status));
      $("cancel-sweep").hidden = SWEEP_ENDED.includes(sweep.status);
      replace($("sweep-summary"), sweepSummary(sweep));
      const counts = sweep.trials;
      pairs($("sweep-trials"), [
        ["progress", trialsProgress(sweep)],
        ...["queued", "running", "succeeded", "pruned", "failed", "cancelled"].map((k) =>
          [k, h("span", {id: `count-${k}`, class: counts[k] ? "" : "muted"}, counts[k])]),
      ]);
      const budget = sweep.budget;
      pairs($("sweep-budget"), [
        ["trials", `${budget.trials} of ${budget.max_trials}`],
        ["train time", `${seconds(budget.train_s)}${given(budget.max_total_s) ? ` of ${seconds(budget.max_total_s)}` : ""}`],
        ["parallelism", spec.parallelism], ["seed", spec.seed],
        ["created", new Date(sweep.created_at).toLocaleString()],
        ["finished", sweep.finished_at && new Date(sweep.finished_at).toLocaleString()],
        ["took", sweep.finished_at && seconds((time(sweep.finished_at) - time(sweep.created_at)) / 1000)],
      ]);
      const best = sweep.best;
      $("sweep-no-best").hidden = !!best;
      pairs($("sweep-best"), best ? [
        ["trial", h("a", {href: jobHref(best.job_id), id: "best-trial-link"}, `trial ${best.number}`)],
        [metric, h("strong", {id: "best-objective"}, objectiveText(metric, best.objective))],
        ...Object.entries(best.params).map(([name, value]) => [name, h("code", {}, paramText(value))]),
        ["epochs", best.epochs],
      ] : []);
      replace($("sweep-space"), h("span", {class: "muted"}, "searching"), Object.entries(spec.space).map(([name, d]) =>
        h("span", {class: "dimension", dataset: {param: name}}, h("code", {}, name), ` ${dimensionText(d)}`)));
      $("trials-chart-caption").textContent = `${metric} per trial (${spec.objective.direction === "max" ? "higher" : "lower"} is better)`;
      $("epochs-chart-caption").textContent = `${metric} per epoch, one line per trial`;
      replace($("trials-head"), h("tr", {}, h("th", {class: "num"}, "trial"), h("th", {}, "status"),
        names.map((name) => h("th", {class: "num", dataset: {param: name}}, name)), h("th", {class: "num"}, "epochs"),
        h("th", {class: "num", id: "objective-heading"}, metric), h("th", {}, "job")));
      replace($("trials-body"), bestFirst(trials, spec.objective.direction).map((t) => trialRow(t, sweep, names)));
      $("trials-empty").hidden = trials.length > 0;
      renderCharts(sweep, trials);
      $("sweep-updated").textContent = SWEEP_ENDED.includes(sweep.status) ? "" : `updates live · ${new Date().toLocaleTimeString()}`;
    }

    $("cancel-sweep").addEventListener("click", async () => {
      const button = $("cancel-sweep");
      if (!cancelArmed) {
        button.textContent = "Click again to cancel";
        cancelArmed = setTimeout(() => { cancelArmed = null; button.textContent = "Cancel sweep"; }, 4000);
        return;
      }
      clearTimeout(cancelArmed);
      cancelArmed = null;
      button.disabled = true;
      try {
        await api(`/sweeps/${encodeURIComponent(sweepId)}/cancel`, {method: "POST"});
      } catch (error) {
        if (!(error instanceof AuthError)) banner(`Could not cancel: ${error.message}`);
      } finally {
        button.disabled = false;
        button.textContent = "Cancel sweep";
      }
    });

    every(2000, async () => {
      let sweep;
      try {
        sweep = await api(`/sweeps/${encodeURIComponent(sweepId)}`);
      } catch (error) {
        if (error.status !== 404) throw error;
        replace($("content"), h("h1", {}, "Sweep not found"),
          h("p", {}, `There is no sweep ${sweepId} among yours. `, h("a", {href: "/ui/sweeps"}, "Back to the sweeps")));
        return false;
      }
      const trials = (await api(`/sweeps/${encodeURIComponent(sweepId)}/trials`)).items;
      if (sweep.spec.base.dataset) await learnDatasetNames([sweep.spec.base]);
      await fetchMetrics(trials);
      render(sweep, trials);
      return !SWEEP_ENDED.includes(sweep.status);
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

  const PAGES = {jobs: jobsPage, job: jobPage, comparisons: comparisonsPage, comparison: comparisonPage,
    datasets: datasetsPage, dataset: datasetPage, sweeps: sweepsPage, sweep: sweepPage, workers: workersPage};

  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => { forgetKey(); window.location.reload(); });
    if (apiKey()) start(); else showSignIn();
  });
})();
