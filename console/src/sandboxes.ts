// The tenant's sandboxes: state, template, backend, age, TTL left, CPU, memory and disk where
// metrics exist; create, renew, pause and resume, delete.

import { Api, ApiError, SandboxInfo } from "./api";
import { duration, h, notice, replace } from "./dom";

interface Sample {
  cpu_percent: number | null;
  memory_used: number | null;
  memory_limit: number | null;
  disk_used: number | null;
  disk_total: number | null;
}

function mib(bytes: number | null): string {
  return bytes === null ? "?" : `${Math.round(bytes / (1 << 20))} MiB`;
}

/** "CPU 3% · 40/512 MiB · disk 1/1024 MiB", or "-" before the first sample. */
function usage(sample: Sample | null): string {
  if (sample === null) return "-";
  const cpu = sample.cpu_percent === null ? "?" : `${sample.cpu_percent.toFixed(0)}%`;
  return `CPU ${cpu} · ${mib(sample.memory_used)}/${mib(sample.memory_limit)} · disk ${mib(sample.disk_used)}/${mib(sample.disk_total)}`;
}

interface Template {
  name: string;
  backend: string;
}

export async function sandboxesView(api: Api): Promise<HTMLElement> {
  const status = h("div", { "aria-live": "polite" });
  const rows = h("tbody");
  const view = h("section", { "aria-labelledby": "sandboxes-title" });

  async function refresh(): Promise<void> {
    const { sandboxes } = await api.call<{ sandboxes: SandboxInfo[] }>("GET", "/v1/sandboxes");
    const samples = await Promise.all(
      sandboxes.map((sandbox) =>
        api
          .call<{ latest: Sample | null }>("GET", `/v1/sandboxes/${sandbox.id}/metrics`)
          .then((metrics) => metrics.latest)
          .catch(() => null),
      ),
    );
    const now = Date.now() / 1000;
    replace(
      rows,
      ...sandboxes.map((sandbox, index) =>
        h(
          "tr",
          { "data-sandbox": sandbox.id },
          h("td", {}, h("a", { href: `#/sandbox/${encodeURIComponent(sandbox.id)}` }, sandbox.id)),
          h("td", {}, sandbox.state ?? "running"),
          h("td", {}, sandbox.template),
          h("td", {}, sandbox.backend),
          h("td", {}, duration(now - sandbox.created_at)),
          h("td", {}, sandbox.expires_at === null ? "none" : duration(sandbox.expires_at - now)),
          h("td", { class: "usage" }, usage(samples[index] ?? null)),
          h(
            "td",
            { class: "actions" },
            h("button", { type: "button", "aria-label": `Renew ${sandbox.id} for an hour`, onclick: () => act(() => api.call("POST", `/v1/sandboxes/${sandbox.id}/renew`, { ttl: 3600 }), `Renewed ${sandbox.id}`) }, "Renew"),
            sandbox.state === "paused"
              ? h("button", { type: "button", "aria-label": `Resume ${sandbox.id}`, onclick: () => act(() => api.call("POST", `/v1/sandboxes/${sandbox.id}/resume`), `Resumed ${sandbox.id}`) }, "Resume")
              : h("button", { type: "button", "aria-label": `Pause ${sandbox.id}`, onclick: () => act(() => api.call("POST", `/v1/sandboxes/${sandbox.id}/pause`, { ttl: "keep" }), `Paused ${sandbox.id}`) }, "Pause"),
            h("button", { type: "button", class: "danger", "aria-label": `Delete ${sandbox.id}`, onclick: () => act(() => api.call("DELETE", `/v1/sandboxes/${sandbox.id}`), `Deleted ${sandbox.id}`) }, "Delete"),
          ),
        ),
      ),
    );
    if (sandboxes.length === 0) replace(rows, h("tr", {}, h("td", { colspan: "8" }, "No sandboxes yet.")));
  }

  async function act(call: () => Promise<unknown>, done: string | (() => string)): Promise<void> {
    try {
      await call();
      replace(status, notice(typeof done === "string" ? done : done()));
      await refresh();
    } catch (error) {
      replace(status, notice(error instanceof ApiError ? error.message : String(error), "error"));
    }
  }

  const template = h("select", { id: "template", name: "template" }) as HTMLSelectElement;
  const ttl = h("input", { id: "ttl", name: "ttl", type: "number", min: "60", step: "60", value: "3600" }) as HTMLInputElement;
  try {
    const { templates } = await api.call<{ templates: Template[] }>("GET", "/v1/templates");
    for (const item of templates) {
      template.append(h("option", { value: item.name, selected: item.name === "default" }, `${item.name} (${item.backend})`));
    }
  } catch {
    template.append(h("option", { value: "default" }, "default"));
  }
  const create = h(
    "form",
    {
      class: "inline",
      "aria-label": "Create a sandbox",
      onsubmit: (event: Event) => {
        event.preventDefault();
        let made = "";
        void act(
          async () => {
            made = (await api.call<SandboxInfo>("POST", "/v1/sandboxes", { template: template.value, ttl: Number(ttl.value) })).id;
          },
          () => `Created ${made}`,
        );
      },
    },
    h("label", { for: "template" }, "Template"),
    template,
    h("label", { for: "ttl" }, "TTL (s)"),
    ttl,
    h("button", { type: "submit" }, "Create sandbox"),
  );
  replace(
    view,
    h("h1", { id: "sandboxes-title" }, "Sandboxes"),
    create,
    status,
    h(
      "div",
      { class: "scroll" },
      h(
        "table",
        { class: "sandboxes" },
        h("caption", { class: "visually-hidden" }, "Your sandboxes"),
        h("thead", {}, h("tr", {}, ...["Sandbox", "State", "Template", "Backend", "Age", "TTL left", "Usage", "Actions"].map((name) => h("th", { scope: "col" }, name)))),
        rows,
      ),
    ),
  );
  await refresh();
  return view;
}
