// specwatch monitoring mixin: Prometheus recording rules, alerts and Grafana dashboards for vLLM
// speculative decoding (standard and FLy) and the specwatch sidecar.
//
//   local specwatch = (import 'specwatch/deploy/mixin/mixin.libsonnet') + {
//     _config+:: { vllmSelector: 'job="vllm"', runbookURLPattern: 'https://runbooks.example/%s' },
//   };
//   { 'rules.yaml': std.manifestYamlDoc(specwatch.prometheusRules),
//     'alerts.yaml': std.manifestYamlDoc(specwatch.prometheusAlerts) }
//
// Fields:
//   _config              config.libsonnet (selectors, cluster label, runbook URL pattern, rules-only
//                        knobs) merged with thresholds.libsonnet (generated from the detectors'
//                        Python defaults; do not edit).
//   prometheusRules      {groups: [...]}: the recording rule groups.
//   prometheusAlerts     {groups: [...]}: the alerting rule groups, every alert with a runbook_url.
//   grafanaDashboards    file name -> dashboard JSON: the dashboards of the repository's grafana/
//                        with clusterLabel and the selectors of _config applied
//                        (dashboards.libsonnet; the defaults leave them as checked in).
//
// The rule texts live once, in rules/<area>.yaml.tmpl: YAML with %(name)s placeholders filled
// from _config (a string or number key). Grafana reads the dashboards from ../../grafana, so
// vendor the whole repository with jsonnet-bundler (see README.md), not only this directory.
local strings = import 'strings.libsonnet';
local areas = [
  importstr 'rules/spec_decode.yaml.tmpl',
  importstr 'rules/fly.yaml.tmpl',
  importstr 'rules/quality.yaml.tmpl',
  importstr 'rules/self.yaml.tmpl',
  importstr 'rules/sglang.yaml.tmpl',
];

// template text with every %(key)s replaced by the _config value of that key (a number as %g),
// in one pass; any other % (printf "%.3f") is left alone. Then the matchers an empty selector
// leaves behind are removed: x{a="1", } -> x{a="1"}, x{} -> x.
local fill(text, config) =
  local pieces = strings.split(text, '%(');
  local value(key) =
    assert std.objectHas(config, key) : 'unknown placeholder in a rule template: %(' + key + ')s';
    local v = config[key];
    if std.isNumber(v) then '%g' % v else if std.isString(v) then v
    else error 'placeholder %(' + key + ')s names a _config key that is not a string or number';
  local filled = pieces[0] + std.join('', [
    local parts = strings.split(p, ')s');
    assert std.length(parts) >= 2 : 'unclosed placeholder in a rule template: %(' + parts[0];
    value(parts[0]) + std.join(')s', parts[1:])
    for p in pieces[1:]
  ]);
  std.strReplace(std.strReplace(filled, ', }', '}'), '{}', '');

local isAlertGroup(group) = std.length([r for r in group.rules if std.objectHas(r, 'alert')]) > 0;

local withRunbook(rule, pattern) =
  if std.objectHas(rule, 'alert') then
    assert !std.objectHas(std.get(rule, 'annotations', {}), 'runbook_url') :
           rule.alert + ': runbook_url comes from runbookURLPattern';
    rule { annotations+: { runbook_url: pattern % std.asciiLower(rule.alert) } }
  else rule;

local series(name, matchers, selector) =
  local all = [m for m in matchers + [selector] if m != ''];
  if all == [] then name else name + '{' + std.join(', ', all) + '}';

// SpecX's expression with the sidecar's cause label for the same series (specwatch_alert_cause,
// one series kept per join group), or cause="unknown" where the sidecar names none.
local withCause(rule, config) =
  if std.objectHas(rule, 'alert') && std.objectHas(config.causeJoinLabels, rule.alert) then
    local on = config.groupLabels + ', ' + config.causeJoinLabels[rule.alert];
    local cause = series('specwatch_alert_cause', ['alertname="%s"' % rule.alert],
                         config.specwatchSelector);
    rule {
      expr: '(\n' + rule.expr + ')\n* on (%s) group_left (cause)\n' % on
            + 'topk by (%s) (1, max by (%s, cause) (%s))\n' % [on, on, cause]
            + 'or ignoring (cause)\nlabel_replace(\n' + rule.expr + ', "cause", "unknown", "", "")\n',
      annotations+: {
        description: rule.annotations.description + ' Cause named by the specwatch sidecar: '
                     + '{{ $labels.cause }} (unknown: no sidecar names one; see the runbook).',
      },
    }
  else rule;

// An alert the sidecar also pushes fires only unless its push works (see config.libsonnet).
local backstop(rule, config) =
  if std.objectHas(rule, 'alert') && !std.member(config.rulesOnlyAlerts, rule.alert) then
    local ok = series('specwatch_alertmanager_delivering', [], config.specwatchSelector);
    rule {
      expr: '(\n' + rule.expr + ')\nunless on (%s) (max by (%s) (%s) == 1)\n'
                                 % [config.groupLabels, config.groupLabels, ok],
    }
  else rule;

{
  // jsonnet >= 0.20 (std.trim is the marker): 0.18, Debian 12's, cannot read the templates'
  // multi-line YAML strings with std.parseYaml; say so rather than fail inside it
  assert std.objectHasAll(std, 'trim') :
         'the specwatch mixin needs jsonnet >= 0.20 (C++ or go-jsonnet); Debian 12 has 0.18: '
         + 'use `pip install jsonnet` or go-jsonnet, or take the rendered prometheusrule.yaml',

  _config+:: (import 'config.libsonnet') + (import 'thresholds.libsonnet'),

  local groups = std.flattenArrays([std.parseYaml(fill(area, $._config)).groups for area in areas]),
  local pure = [
    assert !isAlertGroup(g) || std.length([r for r in g.rules if std.objectHas(r, 'record')]) == 0 :
           g.name + ': mixes recording and alerting rules';
    g
    for g in groups
  ],

  prometheusRules+:: {
    groups+: [g for g in pure if !isAlertGroup(g)],
  },

  prometheusAlerts+:: {
    groups+: [
      g {
        rules: [
          withRunbook(backstop(withCause(r, $._config), $._config), $._config.runbookURLPattern)
          for r in g.rules
        ],
      }
      for g in pure
      if isAlertGroup(g)
    ],
  },

  local dashboards = import 'dashboards.libsonnet',
  grafanaDashboards+:: {
    [name]: dashboards.configure(dashboards.files[name], $._config)
    for name in std.objectFields(dashboards.files)
  },
}
