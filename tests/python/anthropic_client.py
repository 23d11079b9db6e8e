"""The official `anthropic` client against an agentmesh front door (Anthropic's Messages API).

Usage: anthropic_client.py MODE BASE_URL [ARGS...]

  fake BASE_URL        BASE_URL is a node without models; its peer serves model `m` (role
                       `chat`) from a scripted fake answering, in order: "plain answer",
                       "streamed answer", a call of tool `weather` with {"city": "Paris"}, and
                       "sunny in Paris", two broken tool calls and "ignored field". Checks
                       the models list, a plain message, a stream (text_stream,
                       get_final_message), one tool round trip, that an unknown field is
                       ignored, count_tokens, and that bad input is refused in Anthropic's
                       error shape.
  key BASE_URL KEY     The node has http.api_keys = [KEY]: a wrong or missing x-api-key is an
                       authentication_error (401), the right one (x-api-key, or the client's
                       api_key) is served. The fake answers "let in" to the one chat sent.
  embedded BASE_URL    The peer serves model `smol` (the embedded SmolLM2): a short plain
                       message and a short stream.

Exit 0 when every check passes; an assertion names what did not.
"""

import json
import sys
import urllib.error
import urllib.request

import anthropic

HI = [{"role": "user", "content": "say hello"}]
WEATHER = {
    "name": "weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def post(base: str, body, headers=None, path="/v1/messages"):
    """POST `path` with raw bytes or JSON: (status, JSON answer)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path,
        data=data,
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def refused(status, answer, code, kind, starts):
    """Asserts Anthropic's error shape: the status, the error type, the message's start."""
    assert status == code, (status, answer)
    assert answer["type"] == "error", answer
    assert answer["error"]["type"] == kind, answer
    assert answer["error"]["message"].startswith(starts), (starts, answer)


def fake(base: str) -> None:
    client = anthropic.Anthropic(base_url=base, api_key="no-key-needed", max_retries=0)

    ids = [m.id for m in client.models.list()]
    assert "m" in ids and "role:chat" in ids, ids

    # What Claude Code adds and does not change the answer: metadata, a beta header.
    plain = client.messages.create(
        model="m", max_tokens=64, system="be brief", messages=HI, metadata={"user_id": "u"},
        extra_headers={"anthropic-beta": "prompt-caching-scope-2026-01-05"},
    )
    assert plain.id.startswith("msg_"), plain
    assert plain.type == "message" and plain.role == "assistant", plain
    assert plain.model == "m", plain
    assert [b.type for b in plain.content] == ["text"], plain
    assert plain.content[0].text == "plain answer", plain
    assert plain.stop_reason == "end_turn", plain
    assert (plain.usage.input_tokens, plain.usage.output_tokens) == (10, 5), plain

    with client.messages.stream(model="role:chat", max_tokens=64, messages=HI) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed answer", text
    assert final.content[0].text == "streamed answer", final
    assert final.stop_reason == "end_turn", final
    assert final.usage.output_tokens == 5, final

    # One tool round trip: the model calls `weather`, the client answers with a tool_result.
    question = {"role": "user", "content": "weather in Paris?"}
    called = client.messages.create(
        model="m", max_tokens=64, messages=[question], tools=[WEATHER],
        tool_choice={"type": "auto"},
    )
    assert called.stop_reason == "tool_use", called
    use = [b for b in called.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "weather", called
    assert use[0].input == {"city": "Paris"}, use[0]
    answered = client.messages.create(
        model="m", max_tokens=64, tools=[WEATHER],
        messages=[
            question,
            {"role": "assistant", "content": called.content},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use[0].id, "content": "sunny"},
            ]},
        ],
    )
    assert answered.content[0].text == "sunny in Paris", answered
    assert answered.stop_reason == "end_turn", answered

    # A streamed tool call: its input arrives as input_json_delta.
    with client.messages.stream(
        model="m", max_tokens=64, messages=[question], tools=[WEATHER]
    ) as stream:
        final = stream.get_final_message()
    use = [b for b in final.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].input == {"city": "Oslo"}, final
    assert final.stop_reason == "tool_use", final

    # Tool arguments that are not a JSON object: an error naming the model, not a broken block.
    broken = "model `m` called tool `weather` with arguments that are not a JSON object"
    try:
        client.messages.create(model="m", max_tokens=64, messages=[question], tools=[WEATHER])
        raise AssertionError("broken tool arguments must be an error")
    except anthropic.APIStatusError as e:
        refused(e.status_code, e.body, 502, "api_error", broken)
    try:
        with client.messages.stream(
            model="m", max_tokens=64, messages=[question], tools=[WEATHER]
        ) as stream:
            stream.get_final_message()
        raise AssertionError("broken streamed tool arguments must be an error")
    except anthropic.APIStatusError as e:
        assert e.body["type"] == "error", e.body
        assert e.body["error"]["message"].startswith(broken), e.body

    # Bad input, through the client: each a 400 invalid_request_error naming the field.
    for kwargs, starts in [
        ({"extra_body": {"max_tokens": "ten"}}, "max_tokens: Input should be"),
        ({"extra_body": {"temperature": "hot"}}, "temperature: Input should be a valid number"),
        ({"extra_body": {"top_k": 40}}, "top_k: is not supported"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
        ]}]}, "messages.0.content.0.type: `image` blocks are not supported"),
    ]:
        arguments = {"model": "m", "max_tokens": 64, "messages": HI, **kwargs}
        try:
            client.messages.create(**arguments)
            raise AssertionError(f"{kwargs} must be refused")
        except anthropic.BadRequestError as e:
            refused(e.status_code, e.body, 400, "invalid_request_error", starts)

    # A field Anthropic's API does not define is ignored (the front door's default,
    # http.unknown_fields = "ignore"); the scripted model answers "ignored field".
    lenient = client.messages.create(
        model="m", max_tokens=64, messages=HI, extra_body={"frobnicate": True}
    )
    assert lenient.content[0].text == "ignored field", lenient

    # What the client would not send: a missing max_tokens, a malformed version header, a
    # body over the 4 MiB limit, an unknown model.
    status, answer = post(base, {"model": "m", "messages": HI})
    refused(status, answer, 400, "invalid_request_error", "max_tokens: Field required")
    status, answer = post(base, {"model": "m", "max_tokens": 8, "messages": HI},
                          {"anthropic-version": "yesterday"})
    refused(status, answer, 400, "invalid_request_error", "anthropic-version")
    status, answer = post(base, b'{"model": "m", "padding": "' + b"x" * (5 << 20) + b'"}')
    refused(status, answer, 413, "invalid_request_error", "request body")
    try:
        client.messages.create(model="no-such-model", max_tokens=8, messages=HI)
        raise AssertionError("an unknown model must be refused")
    except anthropic.NotFoundError as e:
        assert e.body["error"]["type"] == "not_found_error", e.body
    # count_tokens: an estimate for a model the fleet has, a 404 for one it has not.
    counted = client.messages.count_tokens(model="m", messages=HI)
    assert 0 < counted.input_tokens < 50, counted
    status, answer = post(base, {"model": "no-such-model", "messages": HI},
                          path="/v1/messages/count_tokens")
    refused(status, answer, 404, "not_found_error", "the model `no-such-model` does not exist")

    # The front door counts the Messages API by its path.
    with urllib.request.urlopen(f"{base}/metrics", timeout=20) as answer:
        metrics = answer.read().decode()
    for line in ['path="/v1/messages",status="200"', 'path="/v1/messages",status="400"',
                 'path="/v1/messages/count_tokens",status="200"',
                 'path="/v1/messages/count_tokens",status="404"']:
        assert line in metrics, (line, metrics)
    print("ok")


def key(base: str, secret: str) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": HI}
    for headers in [{}, {"x-api-key": "wrong-key-123"}, {"x-api-key": secret + "x"}]:
        status, answer = post(base, body, headers)
        refused(status, answer, 401, "authentication_error", "missing or unknown API key")
    wrong = anthropic.Anthropic(base_url=base, api_key="wrong-key-123", max_retries=0)
    try:
        wrong.messages.create(**body)
        raise AssertionError("a wrong key must be refused")
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body
    # The right x-api-key, without an anthropic-version header (accepted when missing).
    status, answer = post(base, body, {"x-api-key": secret})
    assert status == 200, answer
    assert answer["content"][0]["text"] == "let in", answer
    client = anthropic.Anthropic(base_url=base, api_key=secret, max_retries=0)
    assert "m" in [m.id for m in client.models.list()]
    print("ok")


def embedded(base: str) -> None:
    client = anthropic.Anthropic(base_url=base, api_key="no-key-needed", max_retries=0)
    question = [{"role": "user", "content": "What is the capital of France? One word."}]
    plain = client.messages.create(model="smol", max_tokens=8, messages=question)
    assert plain.model == "smol", plain
    assert plain.content and plain.content[0].text.strip(), plain
    assert plain.usage.input_tokens > 0 and 0 < plain.usage.output_tokens <= 8, plain
    with client.messages.stream(model="smol", max_tokens=8, messages=question) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip() and final.content[0].text == text, (text, final)
    assert 0 < final.usage.output_tokens <= 8, final
    print("ok")


def main() -> None:
    mode, base = sys.argv[1], sys.argv[2]
    if mode == "fake":
        fake(base)
    elif mode == "key":
        key(base, sys.argv[3])
    elif mode == "embedded":
        embedded(base)
    else:
        raise SystemExit(f"unknown mode {mode!r}: fake, key or embedded")


if __name__ == "__main__":
    main()
