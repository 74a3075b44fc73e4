"""A missing fixture skips a test only when fixtures are not required: under XRAY_REQUIRE_FIXTURES
(`make test`) it fails, naming the fixture."""
from __future__ import annotations

import pytest
from conftest import REPO, require_fixture

MISSING = REPO / "fixtures" / "build" / "no-such-fixture"


def test_missing_fixture_skips_when_not_required(monkeypatch):
    monkeypatch.delenv("XRAY_REQUIRE_FIXTURES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-fixture"):
        require_fixture(MISSING)


def test_missing_fixture_fails_when_required(monkeypatch):
    monkeypatch.setenv("XRAY_REQUIRE_FIXTURES", "1")
    with pytest.raises(pytest.fail.Exception, match="no-such-fixture.*XRAY_REQUIRE_FIXTURES"):
        require_fixture(MISSING)


def test_present_fixture_is_returned():
    assert require_fixture(REPO / "fixtures" / "audio") == REPO / "fixtures" / "audio"
