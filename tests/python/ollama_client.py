"""The official `ollama` client against an agentmesh front door.

Usage: ollama_client.py BASE_URL API_KEY
BASE_URL is a node without models of its own, whose http.api_keys holds API_KEY; its peer serves
model `m` (role `chat`) with a scripted fake that answers, in order: "hello from the gpu",
"a streamed answer", "generated", "generated in pieces", a call of `weather` with
{"city": "Paris"}, "It is sunny", a streamed call of `weather`, '{"a": 1}' twice. The Rust test
(tests/tests/ollama.rs) checks what reached the fake. Exit 0 when every check passes.
"""

import sys

import httpx
import ollama


def refused(call, status: int, words: str) -> None:
    """`call` raises ollama's ResponseError with `status`, its message containing `words`."""
    try:
        call()
    except ollama.ResponseError as e:
        assert e.status_code == status, (e.status_code, e.error)
        assert words in e.error, e.error
        return
    raise AssertionError(f"not refused: expected {status} with {words!r}")


def raw(base: str, key: str, path: str, body, status: int, words: str) -> None:
    """A POST of `body` (JSON, or bytes as they are) answers `status` in Ollama's shape."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if isinstance(body, bytes):
        answer = httpx.post(base + path, content=body, headers=headers)
    else:
        answer = httpx.post(base + path, json=body, headers=headers)
    assert answer.status_code == status, (path, answer.status_code, answer.text)
    error = answer.json()
    assert list(error) == ["error"] and words in error["error"], (path, error)


def weather(city: str) -> str:
    """Today's weather.

    Args:
      city: Where.

    Returns:
      str: The weather.
    """
    return "sunny"


def main() -> None:
    base, key = sys.argv[1], sys.argv[2]
    client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"})

    version = httpx.get(f"{base}/api/version", headers={"Authorization": f"Bearer {key}"})
    assert version.status_code == 200 and version.json()["version"], version.text

    names = [m.model for m in client.list().models]
    assert "m" in names and "role:chat" in names, names
    assert "m" in [m.model for m in client.ps().models]
    assert "tools" in client.show("m").capabilities
    refused(lambda: client.show("nope"), 404, 'model "nope" not found')

    plain = client.chat(model="m", messages=[{"role": "user", "content": "say hello"}])
    assert plain.message.content == "hello from the gpu", plain
    assert plain.done and plain.done_reason == "stop", plain
    assert (plain.prompt_eval_count, plain.eval_count) == (10, 5), plain
    assert plain.total_duration > 0 and plain.model == "m", plain

    parts = list(
        client.chat(
            model="role:chat:latest",
            messages=[{"role": "user", "content": "stream it"}],
            stream=True,
        )
    )
    assert "".join(p.message.content or "" for p in parts) == "a streamed answer", parts
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done, parts
    assert parts[-1].eval_count == 5 and parts[-1].model == "m", parts[-1]

    generated = client.generate(model="m", prompt="go", system="be brief")
    assert generated.response == "generated" and generated.done, generated
    pieces = list(client.generate(model="m", prompt="go", stream=True))
    assert "".join(p.response for p in pieces) == "generated in pieces", pieces
    assert pieces[-1].done and pieces[-1].done_reason == "stop", pieces[-1]

    # A tool round trip: the call comes back with its arguments as an object; the result goes
    # back as a `tool` message naming the tool.
    messages = [{"role": "user", "content": "weather in Paris?"}]
    called = client.chat(model="m", messages=messages, tools=[weather])
    calls = called.message.tool_calls
    assert calls and calls[0].function.name == "weather", called
    assert calls[0].function.arguments == {"city": "Paris"}, calls
    messages += [called.message, {"role": "tool", "content": "sunny", "tool_name": "weather"}]
    final = client.chat(model="m", messages=messages, tools=[weather])
    assert final.message.content == "It is sunny", final
    streamed_calls = [
        c
        for p in client.chat(model="m", messages=messages[:1], tools=[weather], stream=True)
        for c in (p.message.tool_calls or [])
    ]
    assert [c.function.name for c in streamed_calls] == ["weather"], streamed_calls

    # `format` and `options` reach the model's backend (checked by the Rust side).
    options = {"temperature": 0.25, "num_predict": 7, "stop": ["END"], "seed": 3, "num_ctx": 4096}
    as_json = client.chat(model="m", messages=messages[:1], format="json", options=options)
    assert as_json.message.content == '{"a": 1}', as_json
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with_schema = client.generate(model="m", prompt="give a", format=schema)
    assert with_schema.response == '{"a": 1}', with_schema

    # Refused, in Ollama's shape: an unknown model (404 as Ollama says it), a wrong or missing
    # key (401), wrong types, options and fields the mesh cannot honour (400 naming them), and
    # a body over the front door's limit (413). None of these reaches the model.
    refused(lambda: client.chat(model="nope", messages=messages[:1]), 404, 'model "nope" not found')
    refused(lambda: list(client.generate(model="nope", prompt="x", stream=True)), 404, "not found")
    wrong = ollama.Client(host=base, headers={"Authorization": "Bearer wrong-key-0123"})
    refused(lambda: wrong.list(), 401, "API key")
    refused(lambda: wrong.chat(model="m", messages=messages[:1]), 401, "API key")
    refused(lambda: ollama.Client(host=base).list(), 401, "API key")
    refused(
        lambda: client.chat(model="m", messages=messages[:1], options={"top_k": 40}),
        400,
        "options.top_k",
    )
    refused(lambda: client.generate(model="m", prompt="x", raw=True), 400, "raw")
    raw(base, key, "/api/chat", {"model": "m", "messages": "hi"}, 400, "messages")
    raw(base, key, "/api/chat", {"model": "m", "messages": [{"role": "user", "content": 5}]},
        400, "messages[0].content")
    raw(base, key, "/api/chat", {"model": "m", "messages": [], "options": {"temperature": "hot"}},
        400, "options.temperature")
    raw(base, key, "/api/generate", {"prompt": "x"}, 400, "model")
    raw(base, key, "/api/generate", {"model": "m", "prompt": "x", "suffix": "}"}, 400, "suffix")
    raw(base, key, "/api/generate", b"{not json", 400, "request body")
    big = b'{"model": "m", "prompt": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    raw(base, key, "/api/generate", big, 413, "limit")
    # An empty conversation only checks the model, as Ollama's load request does.
    loaded = client.chat(model="m", messages=[])
    assert loaded.done and loaded.done_reason == "load", loaded
    print("ok")


if __name__ == "__main__":
    main()
