// The console's live parts, as small progressive enhancement over server-rendered pages:
// - the runs list refreshes its rows' cells in place (state, progress, duration, error) and
//   says when newer runs arrived, without touching the action checkboxes;
// - a run's page follows the run (the runs API: state, attempts, progress, stages) and its
//   log (the log's Server-Sent Events stream), and reloads once when the run ends;
// - the overview's panels are fetched again, each at its own pace, and replaced in place when
//   they changed: the minute chart moves without a reload.
"use strict";
{
    const LIST_EVERY_MS = 4000;
    const RUN_EVERY_MS = 1500;
    const ENDED = new Set(["completed", "failed", "cancelled"]);

    function visible() {
        return document.visibilityState === "visible";
    }

    // As orchestrator.clock.describe words a span: "45 s", "12 min", "3.5 h".
    function describe(seconds) {
        seconds = Math.ceil(seconds);
        if (seconds < 120) return `${seconds} s`;
        const minutes = Math.ceil(seconds / 60);
        return minutes < 120 ? `${minutes} min` : `${(minutes / 60).toFixed(1)} h`;
    }

    // The same words as run_detail.progress_html.
    function progressNodes(progress) {
        const nodes = [];
        let words = progress.total ? `${progress.done} of ${progress.total}` : `${progress.done} done`;
        if (progress.item) words += ` (${progress.item})`;
        if (progress.eta_s !== null && progress.eta_s !== undefined) words += `, ETA ${describe(progress.eta_s)}`;
        if (progress.total) {
            const bar = document.createElement("progress");
            bar.value = progress.done;
            bar.max = progress.total;
            nodes.push(bar, document.createTextNode(" "));
        }
        const text = document.createElement("span");
        text.textContent = words;
        nodes.push(text);
        return nodes;
    }

    function runIdOf(row) {
        const box = row.querySelector("input.action-select");
        return box ? box.value : row.querySelector("th a")?.textContent.trim();
    }

    function followList(table) {
        const body = table.querySelector("tbody");
        let notice = null;
        async function refresh() {
            if (!visible() || document.querySelector("input.action-select:checked")) return;
            const response = await fetch(window.location.href, {headers: {"X-Requested-With": "fetch"}});
            if (!response.ok) return;
            const page = new DOMParser().parseFromString(await response.text(), "text/html");
            const fresh = page.querySelector("#result_list tbody");
            if (!fresh) return;
            const current = new Map(Array.from(body.rows, (row) => [runIdOf(row), row]));
            let newer = 0;
            for (const row of fresh.rows) {
                const old = current.get(runIdOf(row));
                if (!old) {
                    newer += 1;
                    continue;
                }
                // Every cell but the first (the action checkbox, which holds listeners).
                for (let i = 1; i < row.cells.length && i < old.cells.length; i++) {
                    if (old.cells[i].innerHTML !== row.cells[i].innerHTML) {
                        old.cells[i].replaceChildren(...Array.from(row.cells[i].childNodes, (n) => document.importNode(n, true)));
                    }
                }
            }
            if (newer) {
                if (!notice) {
                    notice = document.createElement("p");
                    notice.id = "newer-runs";
                    const link = document.createElement("a");
                    link.href = window.location.href;
                    notice.append(link);
                    table.parentElement.insertBefore(notice, table);
                }
                notice.firstChild.textContent = `${newer} newer run${newer === 1 ? "" : "s"}: show`;
            }
        }
        setInterval(() => refresh().catch(() => {}), LIST_EVERY_MS);
    }

    function followRun(run) {
        const state = document.getElementById("run-state");
        const attempts = document.getElementById("run-attempts");
        const progress = document.getElementById("run-progress");
        let timer = null;

        async function poll() {
            if (!visible()) return;
            const response = await fetch(run.dataset.runUrl, {headers: {Accept: "application/json"}});
            if (!response.ok) return;
            const detail = await response.json();
            const live = detail.live || {};
            const now = ENDED.has(detail.state) ? detail.state : (live.state || detail.state);
            state.textContent = now;
            state.className = `run-state state-${now}`;
            attempts.textContent = detail.attempts;
            const report = live.progress || detail.progress;
            if (report) progress.replaceChildren(...progressNodes(report));
            const stages = Object.assign({}, detail.stages, live.stages || {});
            for (const [name, stageState] of Object.entries(stages)) {
                const box = document.getElementById(`stage-${name}`);
                if (!box) continue;
                box.className = `stage-box state-${stageState}`;
                box.querySelector(".stage-state").textContent = stageState;
            }
            if (ENDED.has(detail.state)) {
                clearInterval(timer);
                // The rest of the page (timeline, result, error) as the end left it.
                setTimeout(() => window.location.reload(), 800);
            }
        }

        if (run.dataset.live === "true") {
            timer = setInterval(() => poll().catch(() => {}), RUN_EVERY_MS);
        }
        followLog(run);
    }

    function followLog(run) {
        const log = document.getElementById("run-log");
        const status = document.getElementById("run-log-status");
        const source = new EventSource(run.dataset.logsUrl);
        source.addEventListener("log", (event) => {
            const line = JSON.parse(event.data);
            const span = document.createElement("span");
            span.className = `level-${line.level}`;
            const stage = line.stage ? ` [${line.stage}]` : "";
            span.textContent = `${line.ts} ${line.level}${stage} ${line.msg}\n`;
            const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
            log.append(span);
            if (atBottom) log.scrollTop = log.scrollHeight;
        });
        source.addEventListener("end", (event) => {
            source.close();
            const ended = JSON.parse(event.data).state;
            status.textContent = log.textContent ? `The run ended (${ended}).` : `No log lines. The run ended (${ended}).`;
        });
        source.onerror = () => {
            if (source.readyState === EventSource.CLOSED) status.textContent = "The log stream closed.";
        };
    }

    function followPanel(panel) {
        async function refresh() {
            if (!visible()) return;
            const response = await fetch(panel.dataset.panelUrl, {headers: {"X-Requested-With": "fetch"}});
            // Signed out meanwhile: the panel's URL answered with the login page.
            if (response.redirected) { window.location.reload(); return; }
            if (!response.ok) return;
            const html = await response.text();
            if (html === panel.dataset.shown) return;
            const fresh = document.createElement("template");
            fresh.innerHTML = html;
            // An opened table of numbers stays open.
            const open = panel.querySelector("details[open]") !== null;
            panel.replaceChildren(fresh.content);
            if (open) panel.querySelector("details")?.setAttribute("open", "");
            panel.dataset.shown = html;
        }
        setInterval(() => refresh().catch(() => {}), Number(panel.dataset.refreshMs));
    }

    function start() {
        const run = document.getElementById("run");
        if (run) followRun(run);
        const table = document.querySelector("body.model-taskhistory.change-list #result_list");
        if (table) followList(table);
        document.querySelectorAll("#overview [data-panel-url]").forEach(followPanel);
    }

    if (document.readyState === "loading") {
        document.addEventListener("DOMContentLoaded", start);
    } else {
        start();
    }
}
