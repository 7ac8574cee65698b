"""The web console in a real browser: Playwright driving Debian's Chromium headless against the
service on loopback, the console built by console/build.sh. Signing in, creating a sandbox,
running a command (stdout and stderr apart), uploading and downloading a file, a background
process, a terminal, deleting the sandbox; another tenant sees none of it; an operator sees every tenant.
Screenshots of each page are saved under ``SANDBOXES_ARTIFACTS`` (default ``.cache/artifacts``).

Chromium reaches nothing but loopback: every other host resolves to nothing and goes to a dead
proxy. It runs without its own sandbox (``--no-sandbox``) because CI runs as root, which
Chromium's sandbox refuses; it only ever loads this service's pages."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from service_harness import KEYS, UNTHROTTLED, Running, running, settings_for

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
LOOPBACK_ONLY = [
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--proxy-server=socks5://127.0.0.1:9",
    "--proxy-bypass-list=127.0.0.1",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-domain-reliability",
    "--disable-sync",
    "--no-first-run",
    "--no-sandbox",
]
ARTIFACTS = Path(os.environ.get("SANDBOXES_ARTIFACTS", REPO / ".cache" / "artifacts")) / "console"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    subprocess.run(["bash", str(REPO / "console" / "build.sh")], check=True)
    settings = settings_for(
        tmp_path_factory.mktemp("console"), console=True, operators=["alice"], tenants=UNTHROTTLED, sample_interval=0.2
    )
    with running(settings) as svc:
        yield svc


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Chromium is missing: apt-get install chromium (.ci/run installs it)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=LOOPBACK_ONLY, headless=True)
        yield launched
        launched.close()


@pytest.fixture(params=[(1280, 800), (390, 844)], ids=["desktop", "phone"])
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    width, height = request.param
    context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    opened = context.new_page()
    opened.set_default_timeout(20_000)
    yield opened
    context.close()


def _shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    width = page.viewport_size["width"] if page.viewport_size else 0
    page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)


def _sign_in(page: Page, service: Running, tenant: str) -> None:
    page.goto(f"{service.url}/console/")
    page.get_by_label("API key").fill(KEYS[tenant])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Sandboxes")).to_be_visible()


def test_a_wrong_key_is_refused_and_nothing_is_loaded_from_elsewhere(page: Page, service: Running) -> None:
    foreign: list[str] = []
    page.on("request", lambda request: None if request.url.startswith(service.url) else foreign.append(request.url))
    page.goto(f"{service.url}/console")
    page.get_by_label("API key").fill("not-a-key")
    page.keyboard.press("Enter")
    expect(page.get_by_role("alert")).to_contain_text("Not signed in")
    _shot(page, "login")
    assert foreign == []
    headers = page.request.get(f"{service.url}/console/").headers
    assert "default-src 'self'" in headers["content-security-policy"]


def test_a_tenant_creates_runs_uploads_downloads_and_deletes(page: Page, service: Running, tmp_path: Path) -> None:
    _sign_in(page, service, "alice")
    page.get_by_role("button", name="Create sandbox").click()
    created = page.get_by_role("status").filter(has_text="Created")
    expect(created).to_be_visible()
    sandbox_id = re.sub(r"^Created ", "", created.inner_text())
    row = page.locator(f"tr[data-sandbox='{sandbox_id}']")
    expect(row).to_be_visible()
    _shot(page, "sandboxes")

    row.get_by_role("link", name=sandbox_id).click()
    expect(page.get_by_role("heading", name=f"Sandbox {sandbox_id}")).to_be_visible()
    page.get_by_label("Upload a file").set_input_files(
        {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hello \x00 world\n"}
    )
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Uploaded")
    with page.expect_download() as downloading:
        page.get_by_role("button", name="Download notes.txt").click()
    saved = tmp_path / "notes.txt"
    downloading.value.save_as(saved)
    assert saved.read_bytes() == b"hello \x00 world\n"
    _shot(page, "files")

    page.get_by_role("tab", name="Run").click()
    page.get_by_label("Command", exact=True).fill("echo hi; echo oops >&2; exit 3")
    page.get_by_role("button", name="Run").click()
    expect(page.get_by_role("status")).to_contain_text("Exit code 3")
    expect(page.locator("pre.output span.stdout")).to_have_text("hi\n")
    expect(page.locator("pre.output span.stderr")).to_have_text("oops\n")
    _shot(page, "run")

    page.get_by_role("tab", name="Processes").click()
    page.get_by_label("Background command").fill("echo started; sleep 300")
    page.get_by_role("button", name="Start").click()
    expect(page.get_by_role("cell", name="running")).to_be_visible()
    page.get_by_role("button", name=re.compile("^Kill ")).click()
    expect(page.get_by_role("cell", name="killed")).to_be_visible()
    _shot(page, "processes")

    page.get_by_role("link", name="Sandboxes", exact=True).click()
    row = page.locator(f"tr[data-sandbox='{sandbox_id}']")
    row.get_by_role("button", name=f"Pause {sandbox_id}").click()
    expect(row.get_by_role("cell", name="paused", exact=True)).to_be_visible()
    row.get_by_role("button", name=f"Resume {sandbox_id}").click()
    expect(row.get_by_role("cell", name="running", exact=True)).to_be_visible()
    expect(row.locator("td.usage")).to_contain_text("MiB")  # sampled once its helper ran the commands above
    _shot(page, "sandboxes-usage")
    row.get_by_role("button", name=f"Delete {sandbox_id}").click()
    expect(page.get_by_role("status")).to_contain_text(f"Deleted {sandbox_id}")
    expect(page.locator(f"tr[data-sandbox='{sandbox_id}']")).to_have_count(0)


def test_the_terminal_runs_what_is_typed(page: Page, service: Running) -> None:
    _sign_in(page, service, "alice")
    page.get_by_role("button", name="Create sandbox").click()
    created = page.get_by_role("status").filter(has_text="Created")
    expect(created).to_be_visible()
    sandbox_id = re.sub(r"^Created ", "", created.inner_text())
    try:
        page.locator(f"tr[data-sandbox='{sandbox_id}']").get_by_role("link", name=sandbox_id).click()
        page.get_by_role("tab", name="Terminal").click()
        expect(page.get_by_role("status")).to_contain_text("Connected")
        page.locator(".xterm-helper-textarea").focus()
        page.keyboard.type("echo hi-from-the-$((40+2))-terminal\n")
        expect(page.locator(".xterm-rows")).to_contain_text("hi-from-the-42-terminal")
        _shot(page, "terminal")
    finally:
        with service.client("alice") as alice:
            alice.delete(f"/v1/sandboxes/{sandbox_id}")


def test_another_tenant_sees_none_of_it_and_only_an_operator_sees_the_service(page: Page, service: Running) -> None:
    with service.client("alice") as alice:
        made = alice.post("/v1/sandboxes", json={}).json()["id"]
    try:
        _sign_in(page, service, "bob")
        expect(page.locator(f"tr[data-sandbox='{made}']")).to_have_count(0)
        expect(page.get_by_role("link", name="Operator")).to_be_hidden()
        page.goto(f"{service.url}/console/#/sandbox/{made}")
        expect(page.get_by_role("alert")).to_be_visible()
        _shot(page, "other-tenant")
        page.get_by_role("button", name="Sign out").click()
        _sign_in(page, service, "alice")
        page.get_by_role("link", name="Operator").click()
        expect(page.get_by_role("cell", name="bob")).to_be_visible()
        expect(page.get_by_role("cell", name="alice")).to_be_visible()
        _shot(page, "operator")
    finally:
        with service.client("alice") as alice:
            alice.delete(f"/v1/sandboxes/{made}")
