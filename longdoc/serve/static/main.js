// The page asks the server what it serves, then starts the ask view, the prediction browser or the analysis.
import { getJSON, setupKeysHelp, shortcuts } from "./common.js";

async function main() {
  const toggleKeys = setupKeysHelp();
  shortcuts({ "?": toggleKeys });
  const info = await getJSON("/api/info");
  const views = { ask: "./ask.js", browse: "./browse.js", analysis: "./analysis.js" };
  const view = await import(views[info.mode]);
  document.getElementById("loading").hidden = true;
  await view.start(info);
}

main().catch((error) => {
  const loading = document.getElementById("loading");
  loading.hidden = false;
  loading.textContent = `Cannot load: ${error.message}`;
});
