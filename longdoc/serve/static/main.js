// The page asks the server what it serves, then starts the ask view or the prediction browser.
import { getJSON, setupKeysHelp, shortcuts } from "./common.js";

async function main() {
  const toggleKeys = setupKeysHelp();
  shortcuts({ "?": toggleKeys });
  const info = await getJSON("/api/info");
  const view = await import(info.mode === "ask" ? "./ask.js" : "./browse.js");
  document.getElementById("loading").hidden = true;
  await view.start(info);
}

main().catch((error) => {
  const loading = document.getElementById("loading");
  loading.hidden = false;
  loading.textContent = `Cannot load: ${error.message}`;
});
