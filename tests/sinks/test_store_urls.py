"""A ClickHouse URL in a log or an error never shows its credentials."""

from core.clickhouse import redact


def test_store_urls_never_show_their_secrets():
    assert redact("http://default:s3cr@t@ch.example:8123/db") == "http://***@ch.example:8123/db"
    assert redact("https://ch.example:8443/?user=u&password=s3cr%40t&secure=1") == \
        "https://ch.example:8443/?user=u&password=***&secure=1"
    assert redact("https://ch.example/?access_token=abc") == "https://ch.example/?access_token=***"
    assert redact("chdb:///var/lib/fleetpulse/chdb") == "chdb:///var/lib/fleetpulse/chdb"
