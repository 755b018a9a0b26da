"""The serving config: the replica name is checked at load, with the key in the message."""

from __future__ import annotations

import pytest

from serving.errors import BadInputError
from serving.server.config import load_server_config


def test_the_replica_name_defaults_to_none_and_loads_when_valid():
    assert load_server_config().replica is None
    assert load_server_config(replica="eu-1").replica == "eu-1"


@pytest.mark.parametrize("replica", ["", "eu/1", ".hidden", "x" * 41])
def test_a_replica_name_that_cannot_name_a_file_fails_at_load(replica):
    with pytest.raises(BadInputError, match="replica: String should match pattern"):
        load_server_config(replica=replica)
