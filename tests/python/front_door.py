"""The official `openai` client against an agentmesh front door.

Usage: front_door.py BASE_URL EXPECTED_TEXT STREAMED_TEXT [API_KEY]
BASE_URL is a node without models of its own; its peer serves model `m` (role `chat`) with a
scripted fake that answers EXPECTED_TEXT, then STREAMED_TEXT. Exit 0 when every check passes.
"""

import sys

import openai


def main() -> None:
    base, expected, streamed = sys.argv[1], sys.argv[2], sys.argv[3]
    key = sys.argv[4] if len(sys.argv) > 4 else "no-key-needed"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)

    ids = [m.id for m in client.models.list()]
    assert "m" in ids and "role:chat" in ids, ids

    plain = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "say hello"}]
    )
    assert plain.choices[0].message.content == expected, plain
    assert plain.choices[0].finish_reason == "stop", plain

    chunks = client.chat.completions.create(
        model="role:chat",
        messages=[{"role": "user", "content": "stream it"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    assert text == streamed, text

    try:
        client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
        raise AssertionError("an unknown model must be refused")
    except openai.NotFoundError as e:
        assert e.status_code == 404, e

    if len(sys.argv) > 4:
        anonymous = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong-key-123", max_retries=0)
        try:
            anonymous.models.list()
            raise AssertionError("a wrong key must be refused")
        except openai.AuthenticationError as e:
            assert e.status_code == 401, e
    print("ok")


if __name__ == "__main__":
    main()
