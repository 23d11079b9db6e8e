"""The official `openai` client's embeddings against an agentmesh front door.

Usage: embeddings.py BASE_URL MODEL CHAT_ONLY_MODEL
BASE_URL is any node; MODEL makes embeddings somewhere in the fleet, CHAT_ONLY_MODEL exists but
only chats. Prints one JSON object with what came back (vectors, usage, the models listed and
each refusal's status and message), for the Rust test to check against what it expects.
"""

import json
import sys

import openai


def refusal(call):
    """The status and message of the error `call` raises (it must raise one)."""
    try:
        call()
    except openai.APIStatusError as e:
        return {"status": e.status_code, "message": e.message, "body": e.body}
    raise AssertionError("the call succeeded but should have been refused")


def main() -> None:
    base, model, chat_only = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="no-key-needed", max_retries=0)
    out = {}

    # The client's default: it asks for base64 and decodes the floats itself.
    one = client.embeddings.create(model=model, input="hello world")
    out["one"] = one.data[0].embedding
    out["one_model"] = one.model
    out["one_usage"] = one.usage.prompt_tokens

    listed = client.embeddings.create(
        model=model, input=["the first text", "a second, different one"], encoding_format="float"
    )
    out["list"] = [d.embedding for d in sorted(listed.data, key=lambda d: d.index)]
    out["list_usage"] = [listed.usage.prompt_tokens, listed.usage.total_tokens]

    raw = client.embeddings.create(model=model, input="hello world", encoding_format="base64")
    out["base64"] = raw.data[0].embedding

    same = len(out["one"])
    out["same_dimensions"] = client.embeddings.create(
        model=model, input="hello world", dimensions=same, encoding_format="float"
    ).data[0].embedding

    out["models"] = {m.id: getattr(m, "capabilities", None) for m in client.models.list()}

    out["chat_only"] = refusal(lambda: client.embeddings.create(model=chat_only, input="x"))
    out["unknown"] = refusal(lambda: client.embeddings.create(model="no-such-model", input="x"))
    # cl100k_base token ids, as langchain's OpenAIEmbeddings sends text by default:
    # [15339, 1917] is "hello world".
    out["tokens"] = client.embeddings.create(
        model=model, input=[[15339, 1917]], encoding_format="float"
    ).data[0].embedding
    out["bad_token"] = refusal(lambda: client.embeddings.create(model=model, input=[[4000000]]))
    out["dimensions"] = refusal(
        lambda: client.embeddings.create(model=model, input="x", dimensions=same + 1)
    )
    out["empty"] = refusal(lambda: client.embeddings.create(model=model, input=[]))
    out["format"] = refusal(
        lambda: client.embeddings.create(model=model, input="x", encoding_format="int8")
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
