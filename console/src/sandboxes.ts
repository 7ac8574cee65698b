// The tenant's sandboxes: state, template, backend, age, TTL left; create, renew, delete.

import { Api, ApiError, SandboxInfo } from "./api";
import { duration, h, notice, replace } from "./dom";

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
    const now = Date.now() / 1000;
    replace(
      rows,
      ...sandboxes.map((sandbox) =>
        h(
          "tr",
          { "data-sandbox": sandbox.id },
          h("td", {}, h("a", { href: `#/sandbox/${encodeURIComponent(sandbox.id)}` }, sandbox.id)),
          h("td", {}, sandbox.state ?? "running"),
          h("td", {}, sandbox.template),
          h("td", {}, sandbox.backend),
          h("td", {}, duration(now - sandbox.created_at)),
          h("td", {}, sandbox.expires_at === null ? "none" : duration(sandbox.expires_at - now)),
          h(
            "td",
            { class: "actions" },
            h("button", { type: "button", "aria-label": `Renew ${sandbox.id} for an hour`, onclick: () => act(() => api.call("POST", `/v1/sandboxes/${sandbox.id}/renew`, { ttl: 3600 }), `Renewed ${sandbox.id}`) }, "Renew"),
            h("button", { type: "button", class: "danger", "aria-label": `Delete ${sandbox.id}`, onclick: () => act(() => api.call("DELETE", `/v1/sandboxes/${sandbox.id}`), `Deleted ${sandbox.id}`) }, "Delete"),
          ),
        ),
      ),
    );
    if (sandboxes.length === 0) replace(rows, h("tr", {}, h("td", { colspan: "7" }, "No sandboxes yet.")));
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
        h("thead", {}, h("tr", {}, ...["Sandbox", "State", "Template", "Backend", "Age", "TTL left", "Actions"].map((name) => h("th", { scope: "col" }, name)))),
        rows,
      ),
    ),
  );
  await refresh();
  return view;
}
