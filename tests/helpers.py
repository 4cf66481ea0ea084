"""Small assertions shared by the API tests."""


def detail(response) -> str:
    """The sentence of an error answer, checking the answer is only that: {"detail": "..."}."""
    body = response.json()
    assert set(body) == {"detail"}
    assert body["detail"]
    return body["detail"]
