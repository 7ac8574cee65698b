{{/* Names, labels and the derived values every template shares. */}}

{{- define "sandboxes.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sandboxes.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sandboxes.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sandboxes.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandboxes.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sandboxes.labels" -}}
helm.sh/chart: {{ include "sandboxes.chart" . }}
{{ include "sandboxes.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The service's pods: what the Service, the PDB and the service NetworkPolicy select. */}}
{{- define "sandboxes.serviceSelectorLabels" -}}
{{ include "sandboxes.selectorLabels" . }}
app.kubernetes.io/component: service
{{- end -}}

{{- define "sandboxes.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sandboxes.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Where sandbox pods live: sandboxes.namespace, else the release namespace. */}}
{{- define "sandboxes.sandboxNamespace" -}}
{{- default .Release.Namespace .Values.sandboxes.namespace -}}
{{- end -}}

{{- define "sandboxes.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "sandboxes.sandboxImage" -}}
{{- printf "%s:%s" .Values.sandboxes.image.repository (default .Chart.AppVersion .Values.sandboxes.image.tag) -}}
{{- end -}}

{{- define "sandboxes.apiKeysSecret" -}}
{{- default (printf "%s-api-keys" (include "sandboxes.fullname" .)) .Values.apiKeys.existingSecret -}}
{{- end -}}

{{- define "sandboxes.apiKeysSecretKey" -}}
{{- if .Values.apiKeys.existingSecret -}}{{ .Values.apiKeys.existingSecretKey }}{{- else -}}api-keys.json{{- end -}}
{{- end -}}

{{- define "sandboxes.testKeySecret" -}}
{{- printf "%s-test-key" (include "sandboxes.fullname" .) -}}
{{- end -}}

{{/*
The helm test's API key: the one already in the cluster (so an upgrade neither changes it nor
restarts the service), else a new random one. Rendered by two templates (its Secret, and the
config holding its hash), so it is made once per render and remembered in a key of .Values
that no user value can have (the schema forbids unknown top-level keys).
*/}}
{{- define "sandboxes.testKey" -}}
{{- if not (hasKey .Values "_testKey") -}}
{{- $key := printf "sbx_%s" (randAlphaNum 43) -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "sandboxes.testKeySecret" .) -}}
{{- if and $existing $existing.data (hasKey $existing.data "api-key") -}}
{{- $key = index $existing.data "api-key" | b64dec -}}
{{- end -}}
{{- $_ := set .Values "_testKey" $key -}}
{{- end -}}
{{- index .Values "_testKey" -}}
{{- end -}}

{{- define "sandboxes.signingSecret" -}}
{{- default (printf "%s-signing" (include "sandboxes.fullname" .)) .Values.signingSecrets.existingSecret -}}
{{- end -}}

{{/*
The chart's signing secrets (base64, for a Secret's data): those already in the cluster, so an
upgrade leaves every token valid, else new random ones.
*/}}
{{- define "sandboxes.signingData" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "sandboxes.signingSecret" .) -}}
{{- $data := dict -}}
{{- range $key := list "preview-token-secret" "e2b-token-secret" -}}
{{- if and $existing $existing.data (hasKey $existing.data $key) -}}
{{- $_ := set $data $key (index $existing.data $key) -}}
{{- else -}}
{{- $_ := set $data $key (randAlphaNum 64 | b64enc) -}}
{{- end -}}
{{- end -}}
{{- toYaml $data -}}
{{- end -}}

{{/*
The snapshot store. The volume is mounted at sandboxes.snapshotMount and the store is a
subdirectory the service makes there itself: it sets its store's directory to 0700, which only
its owner may, and a volume's root is root's (with lost+found on ext4, which it could not read).
*/}}
{{- define "sandboxes.snapshotMount" -}}/var/lib/sandboxes-snapshots{{- end -}}

{{- define "sandboxes.snapshotDir" -}}{{ include "sandboxes.snapshotMount" . }}/store{{- end -}}

{{- define "sandboxes.snapshotClaim" -}}
{{- default (printf "%s-snapshots" (include "sandboxes.fullname" .)) .Values.snapshots.persistence.existingClaim -}}
{{- end -}}

{{/* "true" when every replica mounts one snapshot store: a claim asked ReadWriteMany, or a claim of the user's. */}}
{{- define "sandboxes.snapshotsShared" -}}
{{- $p := .Values.snapshots.persistence -}}
{{- if and $p.enabled (or $p.existingClaim (has "ReadWriteMany" $p.accessModes)) -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the Deployment must stop its pod before starting the next: one replica on a claim
not asked ReadWriteMany, which a new pod on another node could not attach while the old one
holds it (a rolling update would wait forever).
*/}}
{{- define "sandboxes.recreate" -}}
{{- $p := .Values.snapshots.persistence -}}
{{- if and $p.enabled (eq (int .Values.replicaCount) 1) (not (has "ReadWriteMany" $p.accessModes)) -}}true{{- end -}}
{{- end -}}

{{/*
The service's config file (JSON). templates and config come from values as they are (strings
through tpl), so the chart does not depend on any backend's field names; what the chart must
own (where it listens, its data directory) is set last and wins.
*/}}
{{- define "sandboxes.config" -}}
{{- $templates := dict -}}
{{- range $name, $template := .Values.templates -}}
{{- if $template -}}
{{- $rendered := tpl (toYaml $template) $ | fromYaml -}}
{{- if hasKey $rendered "Error" -}}
{{- fail (printf "sandboxes: templates.%s does not render to YAML after tpl: %s" $name $rendered.Error) -}}
{{- end -}}
{{- $_ := set $templates $name $rendered -}}
{{- end -}}
{{- end -}}
{{- $config := deepCopy .Values.config -}}
{{- $_ := set $config "templates" $templates -}}
{{- $_ := set $config "host" "0.0.0.0" -}}
{{- $_ := set $config "port" (int .Values.containerPort) -}}
{{- $_ := set $config "data_dir" "/var/lib/sandboxes" -}}
{{- $_ := set $config "snapshot_dir" (include "sandboxes.snapshotDir" .) -}}
{{- $_ := set $config "revoked_previews_dir" (printf "%s/revoked-previews" (include "sandboxes.snapshotMount" .)) -}}
{{- if and .Values.ingress.enabled .Values.ingress.previews.domain -}}
{{- $_ := set $config "preview_domain" .Values.ingress.previews.domain -}}
{{- end -}}
{{- if not (hasKey $config "owner") -}}
{{- $_ := set $config "owner" (printf "%s.%s" .Release.Namespace (include "sandboxes.fullname" .) | trunc 63 | trimSuffix "-" | trimSuffix ".") -}}
{{- end -}}
{{- if .Values.tests.enabled -}}
{{- $keys := dict (include "sandboxes.testKey" . | sha256sum) "helm-test" -}}
{{- $_ := set $config "api_keys" $keys -}}
{{- $tenants := default (dict) $config.tenants -}}
{{- $_ := set $tenants "helm-test" (dict "max_sandboxes" 1 "max_cpus" 2 "max_memory" "2g" "max_commands" 2 "rate" 10 "burst" 20) -}}
{{- $_ := set $config "tenants" $tenants -}}
{{- end -}}
{{- toPrettyJson $config -}}
{{- end -}}

{{/* An Ingress rule's paths: everything, to the Service's http port. */}}
{{- define "sandboxes.ingressPaths" -}}
paths:
  - path: /
    pathType: Prefix
    backend:
      service:
        name: {{ include "sandboxes.fullname" . }}
        port:
          name: http
{{- end -}}

{{/* The fixed hardening of every container the chart runs. */}}
{{- define "sandboxes.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "sandboxes.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Checks across values that the schema cannot express, with messages that say what to do. */}}
{{- define "sandboxes.validate" -}}
{{- range $key := list "host" "port" "data_dir" "snapshot_dir" "revoked_previews_dir" "templates" "api_keys" "insecure" "config_file" -}}
{{- if hasKey $.Values.config $key -}}
{{- fail (printf "sandboxes: config.%s is the chart's to set, not config's (templates: use the templates value; api_keys: apiKeys; snapshot_dir, revoked_previews_dir: snapshots.persistence; insecure: never in a cluster)" $key) -}}
{{- end -}}
{{- end -}}
{{- if and (not .Values.apiKeys.existingSecret) (not .Values.apiKeys.hashes) (not .Values.tests.enabled) -}}
{{- fail "sandboxes: no API keys: set apiKeys.hashes ({\"<sha256 hex of a key>\": \"<tenant>\"}; `python -m sandboxes.server --new-key TENANT` makes both) or apiKeys.existingSecret. The service refuses to start without keys." -}}
{{- end -}}
{{- if gt (int .Values.replicaCount) 1 -}}
{{- range $name, $template := .Values.templates -}}
{{- if and $template (not (has (toString $template.backend) (list "kubernetes" "docker"))) -}}
{{- fail (printf "sandboxes: replicaCount > 1 needs every template on a backend the replicas share (kubernetes, docker): templates.%s is %s, whose renewals live on one replica's disk" $name (toString $template.backend)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) .Values.snapshots.persistence.enabled (not (include "sandboxes.snapshotsShared" .)) -}}
{{- fail (printf "sandboxes: replicaCount > 1 needs a snapshot store every replica mounts, and snapshots.persistence.accessModes is %s: set it to [ReadWriteMany] (with a StorageClass that provides it: NFS, CephFS, EFS, Azure Files, ...) or set snapshots.persistence.existingClaim to a claim every replica can mount" (toJson .Values.snapshots.persistence.accessModes)) -}}
{{- end -}}
{{- if and .Values.podDisruptionBudget.enabled (lt (int .Values.replicaCount) 2) -}}
{{- fail "sandboxes: podDisruptionBudget.enabled needs replicaCount >= 2: with one replica the budget blocks every node drain" -}}
{{- end -}}
{{- if and .Values.podDisruptionBudget.enabled (not (kindIs "invalid" .Values.podDisruptionBudget.minAvailable)) (not (kindIs "invalid" .Values.podDisruptionBudget.maxUnavailable)) -}}
{{- fail "sandboxes: set only one of podDisruptionBudget.minAvailable and podDisruptionBudget.maxUnavailable (null the other)" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (ne (toString (dig "metrics_access" "key" .Values.config)) "open") (not .Values.serviceMonitor.bearerTokenSecret) -}}
{{- fail "sandboxes: serviceMonitor.enabled needs serviceMonitor.bearerTokenSecret ({name, key} of a Secret holding an API key), or config.metrics_access: open" -}}
{{- end -}}
{{- if and .Values.ingress.enabled .Values.ingress.previews.domain (hasKey .Values.config "preview_domain") (ne (toString .Values.config.preview_domain) .Values.ingress.previews.domain) -}}
{{- fail (printf "sandboxes: config.preview_domain (%s) differs from ingress.previews.domain (%s): set the domain once, in ingress.previews.domain" (toString .Values.config.preview_domain) .Values.ingress.previews.domain) -}}
{{- end -}}
{{- $drain := int (dig "drain_timeout" 30 .Values.config) -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (add $drain (int .Values.preStopSleepSeconds)) -}}
{{- fail (printf "sandboxes: terminationGracePeriodSeconds (%d) must exceed preStopSleepSeconds (%d) + config.drain_timeout (%d), or pods are killed mid-drain" (int .Values.terminationGracePeriodSeconds) (int .Values.preStopSleepSeconds) $drain) -}}
{{- end -}}
{{- end -}}
