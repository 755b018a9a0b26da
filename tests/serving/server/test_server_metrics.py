from prometheus_client.parser import text_string_to_metric_families

from serving.hardware import hardware_target
from serving.server.metrics import ServerMetrics


def gauge(metrics: ServerMetrics) -> list:
    text = metrics.render().decode()
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "specops:champion_evaluated_acceptance_rate"
    ]
    return family.samples


def test_the_champions_evaluated_acceptance_follows_the_serving_draft():
    metrics = ServerMetrics(model_name="smollm2", hardware=hardware_target("cpu"))
    metrics.set_draft("specops-draft-ngram/1", "pld:3", 0.7)
    (sample,) = gauge(metrics)
    assert sample.value == 0.7
    assert sample.labels == {
        "model_name": "smollm2",
        "hardware": "cpu",
        "version": "specops-draft-ngram/1",
        "workload": "live",
    }
    metrics.set_draft("specops-draft-suffix/2", "suffix", 0.4)  # a promotion
    assert [(s.labels["version"], s.value) for s in gauge(metrics)] == [
        ("specops-draft-suffix/2", 0.4)
    ]
    metrics.set_draft("static:pld", "pld:3")  # nothing evaluated it: no gauge, no alert
    assert gauge(metrics) == []
