"""The official `openai` client against the server: completions and chat, plain and streaming."""

import asyncio
from typing import cast

import openai
import pytest
from api_servers import MODEL, Served, wait_for

from api.openai_routes import Job
from engine import SamplingParams
from engine.loop import EngineLoop
from engine.outputs import RequestDelta, RequestOutput


@pytest.fixture(scope="module")
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_completion_plain_and_streaming_agree(client: openai.OpenAI) -> None:
    plain = client.completions.create(
        model=MODEL,
        prompt="The router picks",
        max_tokens=12,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    choice = plain.choices[0]
    assert choice.finish_reason == "length"
    assert plain.usage.prompt_tokens == len("The router picks") + 1  # BOS
    assert plain.usage.completion_tokens == 12
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + 12
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="The router picks",
            max_tokens=12,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    token_chunks = [c for c in chunks if c.choices]
    assert len(token_chunks) == 12  # one chunk per generated token
    assert "".join(c.choices[0].text for c in token_chunks) == choice.text
    assert token_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_chat_plain_and_streaming_agree(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    plain = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=0.0,
        user="someone",
        extra_body={"ignore_eos": True},
    )
    msg = plain.choices[0].message
    assert msg.role == "assistant" and plain.choices[0].finish_reason == "length"
    template = "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    assert plain.usage.prompt_tokens == len(template) + 1
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=0.0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == msg.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    def run(seed: int) -> list[str]:
        out = client.completions.create(
            model=MODEL,
            prompt="seeded",
            max_tokens=16,
            temperature=1.0,
            top_p=0.9,
            seed=seed,
            extra_body={"ignore_eos": True},
        )
        return out.choices[0].text

    assert run(7) == run(7)


def test_stop_strings_cut_the_text_plain_and_streaming(client: openai.OpenAI) -> None:
    kw = {
        "model": MODEL,
        "prompt": "Experts are",
        "temperature": 0.0,
        "extra_body": {"ignore_eos": True},
    }
    full = client.completions.create(max_tokens=40, **kw).choices[0].text
    candidates = [
        full[i : i + 2] for i in range(4, len(full) - 2) if "\ufffd" not in full[i : i + 2]
    ]
    assert candidates, full
    stop = candidates[0]
    expected = full[: full.index(stop)]
    cut = client.completions.create(max_tokens=40, stop=[stop, "never-there"], **kw)
    assert cut.choices[0].text == expected
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(max_tokens=40, stop=stop, stream=True, **kw)
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_token_ids_and_token_prompts(client: openai.OpenAI, served: Served) -> None:
    prompt = [256, 72, 105]
    done: list[RequestOutput] = []
    served.loop.submit(
        prompt,
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
        lambda delta: delta.output is not None and done.append(delta.output),
    )
    wait_for(lambda: bool(done), what="the direct request")
    ids = done[0].token_ids
    stop_at = ids.index(ids[5]) + 1
    out = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=20,
        temperature=0.0,
        extra_body={"ignore_eos": True, "stop_token_ids": [ids[5]]},
    )
    assert out.usage.prompt_tokens == 3
    assert out.usage.completion_tokens == stop_at
    assert out.choices[0].finish_reason == "stop"


def test_several_prompts_give_one_choice_each(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL,
        prompt=["one", "two", "three"],
        max_tokens=4,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.completion_tokens == 12


@pytest.mark.parametrize(("stream", "handed"), [(False, [3]), (True, [1, 2, 3])])
def test_a_whole_reply_is_handed_only_its_last_output(stream: bool, handed: list[int]) -> None:
    """The engine thread calls back with every step's delta; a reply sent whole needs only the
    last (it holds the whole output), so the others never wake the event loop. A stream gets
    each."""

    async def outputs() -> list[int]:
        job = Job(cast(EngineLoop, None), stream)  # the loop is asked only if nothing comes
        job.ids.append("r")
        on_output = job.callback(0)
        whole = RequestOutput("r", [1], [1, 2, 3], "", True, "length", 0.1)
        sent = [
            RequestDelta("r", [n], [0.1 * n], "", n == 3, None, output=whole if n == 3 else None)
            for n in (1, 2, 3)
        ]
        await asyncio.to_thread(lambda: [on_output(delta) for delta in sent])
        got = []
        while job.pending:
            got.extend((await job.next())[1].token_ids)
        assert job.outputs == {0: whole}
        return got

    assert asyncio.run(outputs()) == handed
