"""Every relative link of the README, docs/ and benchmarks/ pages reaches a file and, with
#anchor, a heading of it."""

from __future__ import annotations

import pytest

from tests.docs import markdown


@pytest.mark.parametrize("page", markdown.pages())
def test_relative_links_resolve(page):
    assert markdown.broken_links(page) == []


def test_slugs_follow_github():
    assert markdown.slug("Who this worker is: `tfe.rank()`, `tfe.size()`") == \
        "who-this-worker-is-tferank-tfesize"
    assert markdown.slug("A crash is restarted, a user error is not") == \
        "a-crash-is-restarted-a-user-error-is-not"
    assert markdown.anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
