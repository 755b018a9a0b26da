"""The serving config: the replica name and the TLS pair are checked at load, with the key
in the message."""

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


def test_a_tls_certificate_without_its_key_fails_at_load():
    assert load_server_config().security.tls_cert is None
    loaded = load_server_config(**{"security.tls_cert": "c.pem", "security.tls_key": "k.pem"})
    assert (str(loaded.security.tls_cert), str(loaded.security.tls_key)) == ("c.pem", "k.pem")
    with pytest.raises(BadInputError, match=r"security: .*tls_cert and tls_key go together"):
        load_server_config(**{"security.tls_cert": "c.pem"})
