// The console: sign in with a key, then the tenant's sandboxes, each with its files, a command
// runner, a terminal and its background processes; an operator's key also sees the service.
// Everything goes through the service's public API, as any client's calls do.

import "./style.css";
import { Api, ApiError, storedKey, storeKey } from "./api";
import { h, notice, replace } from "./dom";
import { sandboxesView } from "./sandboxes";
import { sandboxView } from "./sandbox";
import { operatorView } from "./operator";

const app = document.getElementById("app") as HTMLElement;
const signOut = document.getElementById("sign-out") as HTMLButtonElement;
const operatorLink = document.getElementById("operator-link") as HTMLAnchorElement;

signOut.addEventListener("click", () => {
  storeKey(null);
  location.hash = "#/login";
});

function loginView(): HTMLElement {
  const key = h("input", { id: "key", name: "key", type: "password", autocomplete: "off", required: true }) as HTMLInputElement;
  const status = h("div");
  const form = h(
    "form",
    {
      class: "card narrow",
      "aria-labelledby": "login-title",
      onsubmit: async (event: Event) => {
        event.preventDefault();
        const api = new Api(key.value.trim());
        try {
          await api.call("GET", "/v1/sandboxes");
          storeKey(api.key);
          location.hash = "#/sandboxes";
        } catch (error) {
          replace(status, notice(error instanceof ApiError ? `Not signed in: ${error.message}` : String(error), "error"));
        }
      },
    },
    h("h1", { id: "login-title" }, "Sign in"),
    h("label", { for: "key" }, "API key"),
    key,
    h("button", { type: "submit" }, "Sign in"),
    status,
  );
  setTimeout(() => key.focus());
  return form;
}

async function route(): Promise<void> {
  const key = storedKey();
  const [, page, id] = (location.hash || "#/sandboxes").split("/");
  signOut.hidden = key === null;
  if (key === null || page === "login") {
    operatorLink.hidden = true;
    replace(app, loginView());
    return;
  }
  const api = new Api(key);
  api
    .call("GET", "/v1/operator/overview")
    .then(() => (operatorLink.hidden = false))
    .catch(() => (operatorLink.hidden = true));
  try {
    if (page === "sandbox" && id) replace(app, await sandboxView(api, decodeURIComponent(id)));
    else if (page === "operator") replace(app, await operatorView(api));
    else replace(app, await sandboxesView(api));
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      storeKey(null);
      location.hash = "#/login";
      return;
    }
    replace(app, notice(error instanceof Error ? error.message : String(error), "error"));
  }
  app.focus();
}

window.addEventListener("hashchange", () => void route());
void route();
