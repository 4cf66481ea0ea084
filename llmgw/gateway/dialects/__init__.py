"""The other APIs clients speak, translated to and from chat completions for an engine that
serves only those: OpenAI's Responses API (`responses`) and Anthropic's Messages API
(`messages`). Pure functions and stream translators over parsed JSON: no I/O, no clock (the
time and the request id are passed in), so each rule is tested alone. A body the translation
cannot honour is refused with a 400 naming the field (`answers.Refused`), never guessed at.

`fields` checks a body's fields; `chat` reads a chat completion, whole or streamed, into the
parts both dialects write; `sse` reads an engine's event stream into chunks and writes one
typed event as both APIs send them."""
