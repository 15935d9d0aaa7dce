// Python-Markdown writes ```mermaid blocks as <pre><code class="language-mermaid">; mermaid wants <div class="mermaid">.
document.addEventListener("DOMContentLoaded", function () {
  if (typeof mermaid === "undefined") return;  // offline: the diagram's source stays readable
  document.querySelectorAll("pre > code.language-mermaid").forEach(function (code) {
    var div = document.createElement("div");
    div.className = "mermaid";
    div.textContent = code.textContent;
    code.parentNode.replaceWith(div);
  });
  mermaid.initialize({ startOnLoad: false });
  mermaid.run();
});
