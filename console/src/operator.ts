// For an operator's key: every tenant with its usage against its quotas, the templates, and the
// service's health.

import { Api } from "./api";
import { h } from "./dom";

interface TenantUsage {
  tenant: string;
  sandboxes: number;
  cpus: number;
  memory: number;
  max_sandboxes: number | null;
  max_cpus: number | null;
  max_memory: number | null;
}

interface Overview {
  tenants: TenantUsage[];
  templates: { name: string; backend: string; cpus: number; memory: string; ttl: number }[];
  health: { status: string; backends?: Record<string, string> };
}

function limit(value: number | null): string {
  return value === null ? "no limit" : String(value);
}

export async function operatorView(api: Api): Promise<HTMLElement> {
  const overview = await api.call<Overview>("GET", "/v1/operator/overview");
  const mib = (bytes: number | null): string => (bytes === null ? "no limit" : `${Math.round(bytes / (1 << 20))} MiB`);
  return h(
    "section",
    { "aria-labelledby": "operator-title" },
    h("h1", { id: "operator-title" }, "Service"),
    h("p", { class: "meta" }, `Health: ${overview.health.status}`),
    h("h2", {}, "Tenants"),
    h(
      "div",
      { class: "scroll" },
      h(
        "table",
        {},
        h("thead", {}, h("tr", {}, ...["Tenant", "Sandboxes", "CPUs", "Memory"].map((name) => h("th", { scope: "col" }, name)))),
        h(
          "tbody",
          {},
          ...overview.tenants.map((usage) =>
            h(
              "tr",
              {},
              h("td", {}, usage.tenant),
              h("td", {}, `${usage.sandboxes} / ${limit(usage.max_sandboxes)}`),
              h("td", {}, `${usage.cpus} / ${limit(usage.max_cpus)}`),
              h("td", {}, `${mib(usage.memory)} / ${mib(usage.max_memory)}`),
            ),
          ),
        ),
      ),
    ),
    h("h2", {}, "Templates"),
    h(
      "ul",
      {},
      ...overview.templates.map((template) =>
        h("li", {}, `${template.name}: ${template.backend}, ${template.cpus} CPU, ${template.memory}, TTL ${template.ttl} s`),
      ),
    ),
  );
}
