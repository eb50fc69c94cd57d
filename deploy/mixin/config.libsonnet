// The mixin's _config defaults: what the rules need that specwatch's Python detectors do not have.
// Override any key when importing the mixin:
//
//   (import 'specwatch/deploy/mixin/mixin.libsonnet') + { _config+:: { vllmSelector: 'job="vllm"' } }
//
// Thresholds shared with the detectors are NOT here: they are in thresholds.libsonnet, which
// `python -m deploy.mixin.render` writes from specwatch.alerts.settings.DetectSettings and
// specwatch.shadow.settings.PairedSettings defaults (e-value bound = 1 / alpha), so each is
// defined once. Both files are merged into _config; a key may not be in both.
{
  // Label matchers added to every vLLM series (vllm:*) the rules read, e.g. 'job="vllm"'; empty
  // (the default) reads every vLLM server Prometheus scrapes.
  vllmSelector: '',
  // The same for every SGLang series (sglang:*), e.g. 'job="sglang"'.
  sglangSelector: '',
  // Label matchers added to every specwatch series (specwatch_*) the rules read, e.g.
  // 'job="specwatch"'; empty (the default) reads every specwatch sidecar.
  specwatchSelector: '',
  // The label that names a cluster when one Prometheus (or Thanos) holds several. Recording
  // rules and alerts aggregate by it and by namespace, so two clusters or two namespaces are
  // never summed together; a series without the label is its own group (empty value).
  clusterLabel: 'cluster',
  // Labels every aggregation keeps (derived; override only to add more, e.g. 'cluster, namespace, env').
  groupLabels: '%s, namespace' % self.clusterLabel,
  // Runbook link of every alert; %s is the alert name in lower case (the GitHub anchor of its
  // heading in docs/runbook.md). Point it at your own copy of the runbook if you keep one.
  runbookURLPattern: 'https://github.com/specwatch/specwatch/blob/main/docs/runbook.md#%s',
  // metadata.name of the rendered PrometheusRule (prometheusrule.yaml).
  prometheusRuleName: 'specwatch',
  // metadata.labels of the rendered PrometheusRule; add your Prometheus ruleSelector's label
  // (kube-prometheus-stack: release: <name>) with a kustomize patch, as deploy/overlays/example does.
  prometheusRuleLabels: {
    'app.kubernetes.io/name': 'specwatch',
    'app.kubernetes.io/component': 'alerting',
  },
  // One loss, one page. The sidecar pushes its own alerts to Alertmanager under the same names
  // as these rules. Every alert here except rulesOnlyAlerts fires only unless a sidecar in
  // its groupLabels (cluster, namespace) exports specwatch_alertmanager_delivering == 1 (an
  // Alertmanager acknowledged its posts lately): while the push works it pages alone; when it
  // fails, is not configured (alerting.urls empty) or the sidecar is gone, the rules page.
  rulesOnlyAlerts: ['SpecQualityDriftFleet'],
  // The rules that copy the sidecar's `cause` label (specwatch_alert_cause), each with the labels
  // its series share with the sidecar's besides groupLabels; without that gauge, cause="unknown".
  causeJoinLabels: {
    SpecAcceptanceDrop: 'role',
    SpecAcceptanceDecay: 'role',
    SpecBudgetStarvation: 'job, instance, target, role',
  },
}
