import pytest
from pydantic import ValidationError

from serving.server.schemas import ChatCompletionRequest, CompletionRequest, error_body


def completion(**fields):
    return CompletionRequest.model_validate({"model": "m", "prompt": "hi", **fields})


def test_openai_defaults():
    body = completion()
    assert body.temperature == 1.0 and body.top_p == 1.0 and body.max_tokens is None
    assert body.stop == [] and body.drafter == "champion" and not body.stream


def test_stop_accepts_a_string_or_a_list():
    assert completion(stop="\n").stop == ["\n"]
    assert completion(stop=["a", "b"]).stop == ["a", "b"]


def test_max_completion_tokens_is_an_alias_of_max_tokens():
    assert completion(max_completion_tokens=7).max_tokens == 7


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"max_tokens": -3}, "max_tokens must be >= 1"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 2}, "n=2 is not supported"),
        ({"frequency_penalty": 0.5}, "not supported"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "at most 4 stop sequences"),
        ({"stop": [""]}, "non-empty"),
        ({"prompt": "  "}, "the prompt is empty"),
        ({"prompt": ["a", "b"]}, "one prompt per request"),
        ({"echo": True}, "echo"),
        ({"logprobs": 3}, "logprobs"),
        ({"drafter": "model:/etc"}, "not available per request"),
        ({"drafter": "wat"}, "not available per request"),
        ({"drafter": "ngram:4,store=/etc/passwd"}, "not accepted per request"),
        ({"drafter": "ngram:4, fallback=shared"}, "not accepted per request"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 65}, "num_speculative_tokens"),
        ({"draft_policy": "fastest"}, "draft_policy"),
    ],
)
def test_bad_fields_fail_with_the_field_named(fields, message):
    with pytest.raises(ValidationError, match=message):
        completion(**fields)


def test_n_gram_fallbacks_are_accepted_per_request():
    assert completion(drafter="ngram:3,fallback=target,min_conf=0.2").drafter == (
        "ngram:3,fallback=target,min_conf=0.2"
    )


def test_unknown_fields_are_ignored():
    assert completion(some_client_extension=True).model == "m"


def test_chat_messages_text_parts_and_developer_role():
    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}],
                },
            ],
        }
    )
    assert body.as_template_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi there"},
    ]


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    ],
)
def test_bad_chat_messages(messages):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": messages})


def test_error_body_has_openai_shape():
    assert error_body("bad", kind="invalid_request_error", param="x") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "x", "code": None}
    }
