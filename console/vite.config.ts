// The console is served by the service under /console; its build goes into the Python package,
// so every asset is the service's own (no CDN at run time).
import { defineConfig } from "vite";

export default defineConfig({
  base: "/console/",
  build: {
    outDir: "../sandboxes/server/console/static",
    emptyOutDir: true,
    assetsInlineLimit: 0,
  },
});
