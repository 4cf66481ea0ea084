// The playground (templates/catalog/playground.html): the conversation goes to the
// gateway's /v1/chat/completions with the page's key, streamed; each answer is shown as
// its tokens arrive, with the time to its first token, its tokens a second and the
// replica that answered (X-Llmgw-Replica). Text is put in with textContent, never as HTML.
(function () {
  var root = document.getElementById("playground");
  if (!root) return;
  var form = document.getElementById("chat-form");
  var turns = document.getElementById("chat-turns");
  var status = document.getElementById("chat-status");
  var send = document.getElementById("chat-send");
  var history = [];

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function figure(name, value) {
    var f = el("span", "figure");
    f.setAttribute("data-figure", name);
    f.textContent = value;
    return f;
  }

  function said(error, fallback) {
    if (error && error.error && error.error.message) return error.error.message;
    return fallback;
  }

  async function ask(model, messages, maxTokens, answer, figures) {
    var started = performance.now();
    var first = null;
    var usage = null;
    var pieces = 0;
    var response = await fetch(root.dataset.endpoint, {
      method: "POST",
      headers: { "Authorization": "Bearer " + root.dataset.key, "Content-Type": "application/json" },
      body: JSON.stringify({
        model: model, messages: messages, stream: true, max_tokens: maxTokens,
        stream_options: { include_usage: true }
      })
    });
    var replica = response.headers.get("X-Llmgw-Replica");
    if (!response.ok) {
      var body = null;
      try { body = await response.json(); } catch (e) { body = null; }
      throw new Error(said(body, "The gateway answered " + response.status + "."));
    }
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var rest = "";
    var text = "";
    for (;;) {
      var step = await reader.read();
      if (step.done) break;
      rest += decoder.decode(step.value, { stream: true });
      var events = rest.split("\n\n");
      rest = events.pop();
      events.forEach(function (event) {
        var data = event.split("\n").filter(function (l) { return l.indexOf("data:") === 0; })
          .map(function (l) { return l.slice(5).trim(); }).join("");
        if (!data || data === "[DONE]") return;
        var obj;
        try { obj = JSON.parse(data); } catch (e) { return; }
        if (obj.error) throw new Error(said(obj, "The stream ended with an error."));
        if (obj.usage) usage = obj.usage;
        (obj.choices || []).forEach(function (c) {
          var piece = c.delta && c.delta.content;
          if (piece) {
            if (first === null) first = performance.now();
            pieces += 1;
            text += piece;
            answer.textContent = text;
          }
        });
      });
    }
    var ended = performance.now();
    var tokens = usage && usage.completion_tokens ? usage.completion_tokens : pieces;
    figures.textContent = "";
    if (first !== null) figures.appendChild(figure("ttft", "first token " + Math.round(first - started) + " ms"));
    if (first !== null && ended > first && tokens > 1) {
      figures.appendChild(figure("tps", ((tokens - 1) * 1000 / (ended - first)).toFixed(1) + " tokens/s"));
    }
    figures.appendChild(figure("tokens", tokens + " tokens"));
    if (replica) figures.appendChild(figure("replica", "replica " + replica));
    return text;
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    var message = form.elements.message.value.trim();
    if (!message) return;
    var model = form.elements.model.value;
    var maxTokens = parseInt(form.elements.max_tokens.value, 10) || 256;
    var system = form.elements.system.value.trim();
    history.push({ role: "user", content: message });
    var messages = (system ? [{ role: "system", content: system }] : []).concat(history);
    var turn = el("li", "turn");
    turn.appendChild(el("div", "asked", message));
    var answer = el("div", "answer");
    var figures = el("div", "figures muted");
    turn.appendChild(answer);
    turn.appendChild(figures);
    turns.appendChild(turn);
    // The form is below the conversation: keep it where the operator types.
    form.scrollIntoView({ block: "nearest" });
    form.elements.message.value = "";
    send.disabled = true;
    status.textContent = "asking " + model + "…";
    try {
      var text = await ask(model, messages, maxTokens, answer, figures);
      history.push({ role: "assistant", content: text });
      turn.setAttribute("data-done", "");
      status.textContent = "";
      form.scrollIntoView({ block: "nearest" });
    } catch (e) {
      history.pop();
      turn.setAttribute("data-failed", "");
      answer.className = "answer error";
      answer.textContent = e.message;
      status.textContent = "";
    } finally {
      send.disabled = false;
    }
  });

  document.getElementById("chat-clear").addEventListener("click", function () {
    history = [];
    turns.textContent = "";
  });
})();
