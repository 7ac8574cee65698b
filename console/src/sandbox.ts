// One sandbox: its files (list, view, upload, download), a command runner that streams stdout
// and stderr in two colours, a terminal, and background processes started here.

import { Api, ApiError, FileInfo, SandboxInfo, base64ToBytes, bytesToBase64 } from "./api";
import { h, notice, replace } from "./dom";
import { openTerminal } from "./terminal";

type Tab = "files" | "run" | "terminal" | "processes";
const TABS: [Tab, string][] = [
  ["files", "Files"],
  ["run", "Run"],
  ["terminal", "Terminal"],
  ["processes", "Processes"],
];

export async function sandboxView(api: Api, id: string): Promise<HTMLElement> {
  const sandbox = await api.call<SandboxInfo>("GET", `/v1/sandboxes/${id}`);
  const panel = h("div", { role: "tabpanel", id: "panel", tabindex: "0" });
  const tabs = h("div", { role: "tablist", "aria-label": "Sandbox views" });
  let closeCurrent: (() => void) | null = null;

  function show(tab: Tab): void {
    closeCurrent?.();
    closeCurrent = null;
    for (const button of Array.from(tabs.children)) {
      button.setAttribute("aria-selected", String(button.getAttribute("data-tab") === tab));
    }
    if (tab === "files") replace(panel, filesPanel(api, sandbox));
    if (tab === "run") replace(panel, runPanel(api, id));
    if (tab === "processes") replace(panel, processesPanel(api, id));
    if (tab === "terminal") {
      const { element, close } = openTerminal(api, id);
      closeCurrent = close;
      replace(panel, element);
    }
  }
  for (const [tab, label] of TABS) {
    tabs.append(h("button", { type: "button", role: "tab", "data-tab": tab, "aria-controls": "panel", onclick: () => show(tab) }, label));
  }
  window.addEventListener("hashchange", () => closeCurrent?.(), { once: true });
  const view = h(
    "section",
    { "aria-labelledby": "sandbox-title" },
    h("h1", { id: "sandbox-title" }, `Sandbox ${sandbox.id}`),
    h("p", { class: "meta" }, `${sandbox.template} on ${sandbox.backend}, workdir ${sandbox.workdir ?? "/"}`),
    tabs,
    panel,
  );
  show("files");
  return view;
}

function filesPanel(api: Api, sandbox: SandboxInfo): HTMLElement {
  const status = h("div", { "aria-live": "polite" });
  const list = h("ul", { class: "files", "aria-label": "Files" });
  const viewer = h("pre", { class: "viewer", "aria-label": "File contents", hidden: true });
  const path = h("input", { id: "path", name: "path", value: sandbox.workdir ?? "/" }) as HTMLInputElement;
  const upload = h("input", { id: "upload", name: "upload", type: "file" }) as HTMLInputElement;

  async function list_(dir: string): Promise<void> {
    try {
      const { entries } = await api.file<{ entries: FileInfo[] }>(sandbox.id, "ls", { path: dir });
      path.value = dir;
      const parent = dir.replace(/\/[^/]+\/?$/, "") || "/";
      replace(
        list,
        dir !== "/" ? h("li", {}, h("button", { type: "button", class: "link", onclick: () => void list_(parent) }, "..")) : null,
        ...entries.map((entry) => {
          const name = entry.path.split("/").pop() || entry.path;
          return h(
            "li",
            {},
            h("button", { type: "button", class: "link", onclick: () => void (entry.is_dir ? list_(entry.path) : view(entry.path)) }, entry.is_dir ? `${name}/` : name),
            entry.is_dir ? null : h("span", { class: "size" }, `${entry.size ?? "?"} B`),
            entry.is_dir ? null : h("button", { type: "button", "aria-label": `Download ${name}`, onclick: () => void download(entry.path) }, "Download"),
          );
        }),
      );
    } catch (error) {
      replace(status, notice(message(error), "error"));
    }
  }

  async function view(file: string): Promise<void> {
    try {
      const answer = await api.file<{ file_data?: { content?: string } | null }>(sandbox.id, "read", { file_path: file, offset: 0, limit: 2000 });
      viewer.hidden = false;
      viewer.textContent = answer.file_data?.content ?? "";
    } catch (error) {
      replace(status, notice(message(error), "error"));
    }
  }

  async function download(file: string): Promise<void> {
    try {
      const [item] = await api.call<{ path: string; content_b64: string | null; message: string | null }[]>("POST", `/v1/sandboxes/${sandbox.id}/files/download`, { paths: [file] });
      if (!item || item.content_b64 === null) throw new Error(item?.message ?? "nothing came back");
      const link = h("a", { href: URL.createObjectURL(new Blob([base64ToBytes(item.content_b64)])), download: file.split("/").pop() ?? "file" }) as HTMLAnchorElement;
      link.click();
      URL.revokeObjectURL(link.href);
    } catch (error) {
      replace(status, notice(message(error), "error"));
    }
  }

  async function send(): Promise<void> {
    const chosen = upload.files?.[0];
    if (!chosen) return;
    const target = `${path.value.replace(/\/$/, "")}/${chosen.name}`;
    try {
      const [answer] = await api.call<{ path: string; error: string | null }[]>("POST", `/v1/sandboxes/${sandbox.id}/files/upload`, {
        files: [{ path: target, content_b64: bytesToBase64(new Uint8Array(await chosen.arrayBuffer())) }],
      });
      if (answer?.error) throw new Error(`${target}: ${answer.error}`);
      replace(status, notice(`Uploaded ${target}`));
      await list_(path.value);
    } catch (error) {
      replace(status, notice(message(error), "error"));
    }
  }

  void list_(path.value);
  return h(
    "div",
    {},
    h("form", { class: "inline", onsubmit: (event: Event) => { event.preventDefault(); void list_(path.value); } }, h("label", { for: "path" }, "Directory"), path, h("button", { type: "submit" }, "List")),
    h("form", { class: "inline", onsubmit: (event: Event) => { event.preventDefault(); void send(); } }, h("label", { for: "upload" }, "Upload a file"), upload, h("button", { type: "submit" }, "Upload")),
    status,
    list,
    viewer,
  );
}

function runPanel(api: Api, id: string): HTMLElement {
  const command = h("input", { id: "command", name: "command", autocomplete: "off", required: true }) as HTMLInputElement;
  const output = h("pre", { class: "output", "aria-label": "Command output", "aria-live": "polite" });
  const status = h("div");
  const form = h(
    "form",
    {
      class: "inline",
      onsubmit: async (event: Event) => {
        event.preventDefault();
        output.replaceChildren();
        replace(status, notice("Running..."));
        try {
          const result = await api.stream(id, command.value, (item) => {
            if (item.type === "output" && item.data) output.append(h("span", { class: item.stream === "stderr" ? "stderr" : "stdout" }, item.data));
          });
          replace(status, notice(result.error ? `${result.error}: ${result.message ?? ""}` : `Exit code ${result.exit_code}`, result.error ? "error" : "info"));
        } catch (error) {
          replace(status, notice(message(error), "error"));
        }
      },
    },
    h("label", { for: "command" }, "Command"),
    command,
    h("button", { type: "submit" }, "Run"),
  );
  setTimeout(() => command.focus());
  return h("div", {}, form, status, output);
}

interface ProcessInfo {
  id: string;
  status: string;
  output?: string | null;
}

function processesPanel(api: Api, id: string): HTMLElement {
  const key = `sandboxes.console.processes.${id}`;
  const known: string[] = JSON.parse(sessionStorage.getItem(key) ?? "[]") as string[];
  const rows = h("tbody");
  const status = h("div");
  const command = h("input", { id: "process-command", name: "process-command", autocomplete: "off", required: true }) as HTMLInputElement;

  async function refresh(): Promise<void> {
    const infos = await Promise.all(known.map((pid) => api.call<ProcessInfo>("GET", `/v1/sandboxes/${id}/processes/${pid}`).catch((error: unknown) => ({ id: pid, status: message(error), output: "" }))));
    replace(
      rows,
      ...infos.map((info) =>
        h(
          "tr",
          {},
          h("td", {}, info.id),
          h("td", {}, info.status),
          h("td", {}, h("pre", { class: "output small" }, (info.output ?? "").slice(-2000))),
          h("td", {}, info.status === "running" ? h("button", { type: "button", class: "danger", "aria-label": `Kill ${info.id}`, onclick: () => void api.call("DELETE", `/v1/sandboxes/${id}/processes/${info.id}`).then(refresh) }, "Kill") : null),
        ),
      ),
    );
  }
  const form = h(
    "form",
    {
      class: "inline",
      onsubmit: async (event: Event) => {
        event.preventDefault();
        try {
          const started = await api.call<ProcessInfo>("POST", `/v1/sandboxes/${id}/processes`, { command: command.value });
          known.unshift(started.id);
          sessionStorage.setItem(key, JSON.stringify(known.slice(0, 50)));
          await refresh();
        } catch (error) {
          replace(status, notice(message(error), "error"));
        }
      },
    },
    h("label", { for: "process-command" }, "Background command"),
    command,
    h("button", { type: "submit" }, "Start"),
    h("button", { type: "button", onclick: () => void refresh() }, "Refresh"),
  );
  void refresh();
  return h("div", {}, form, status, h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, ...["Process", "Status", "Output", ""].map((name) => h("th", { scope: "col" }, name)))), rows)));
}

function message(error: unknown): string {
  return error instanceof ApiError ? `${error.code}: ${error.message}` : error instanceof Error ? error.message : String(error);
}
