"""The page ``deepnmt-serve`` answers at ``GET /``: a text box, a translate button, the result and
the model's name.  Everything it needs is here (no font, script or style from elsewhere): the HTML
below and the script at ``/page.js``, served by the package itself, so a Content-Security-Policy of
``default-src 'self'`` holds."""

from __future__ import annotations

import html

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>deepnmt-serve: {model}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 46rem; margin: 2rem auto; padding: 0 1rem; color: #222; }}
textarea {{ width: 100%; min-height: 7rem; font-size: 1rem; box-sizing: border-box; }}
button {{ font-size: 1rem; padding: 0.4rem 1.2rem; margin: 0.6rem 0; }}
#result {{ white-space: pre-wrap; border: 1px solid #ccc; min-height: 3rem; padding: 0.6rem; background: #fafafa; }}
#status {{ color: #666; font-size: 0.9rem; }}
.error {{ color: #a00; }}
</style>
</head>
<body>
<h1>Translate</h1>
<p>Model: <strong id="model">{model}</strong>. One sentence per line.</p>
{key_field}
<textarea id="source" aria-label="text to translate" placeholder="Type a sentence"></textarea><br>
<button id="translate" type="button">Translate</button> <span id="status"></span>
<div id="result" aria-live="polite"></div>
<script src="/page.js"></script>
</body>
</html>
"""

KEY_FIELD = ('<p><label>API key <input id="apikey" type="password" autocomplete="off"></label> '
             '(this server asks for one)</p>')

SCRIPT = """\
"use strict";
document.getElementById("translate").addEventListener("click", async function () {
  const result = document.getElementById("result");
  const status = document.getElementById("status");
  const lines = document.getElementById("source").value.split("\\n");
  const headers = {"Content-Type": "application/json"};
  const key = document.getElementById("apikey");
  if (key && key.value) { headers["Authorization"] = "Bearer " + key.value; }
  status.textContent = "translating\\u2026";
  result.className = "";
  try {
    const response = await fetch("/v1/translate", {method: "POST", headers: headers,
                                                  body: JSON.stringify({text: lines})});
    const body = await response.json();
    if (!response.ok) {
      result.className = "error";
      result.textContent = "Error " + response.status + ": " + body.error;
      status.textContent = "";
      return;
    }
    result.textContent = body.translations.join("\\n");
    status.textContent = body.elapsed_ms.toFixed(0) + " ms";
  } catch (e) {
    result.className = "error";
    result.textContent = String(e);
    status.textContent = "";
  }
});
"""

#: the page loads nothing from elsewhere; inline styles only (its <style> block)
CSP = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self'; connect-src 'self'; frame-ancestors 'none'"


def render(model_name: str, needs_key: bool) -> str:
    return PAGE.format(model=html.escape(model_name), key_field=KEY_FIELD if needs_key else "")
