{{/* Names and labels */}}
{{- define "gpugap.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "gpugap.fullname" -}}
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
{{- end }}

{{/* "<fullname>-<component>": (dict "root" $ "component" "worker") */}}
{{- define "gpugap.componentName" -}}
{{- printf "%s-%s" (include "gpugap.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "gpugap.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpugap.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpugap.labels" -}}
{{ include "gpugap.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* metadata of a namespaced object: (dict "root" $ "component" "worker") */}}
{{- define "gpugap.metadata" -}}
name: {{ include "gpugap.componentName" . }}
namespace: {{ .root.Release.Namespace }}
labels:
  {{- include "gpugap.labels" . | nindent 2 }}
{{- end }}

{{/* Secrets as files: a JSON list of {env, secret, key}, each an existing Secret's key
     mounted under /etc/gpugap/secrets and its path passed as the *_FILE (or TLS file)
     setting. (dict "root" $ "c" .Values.worker "kafka" true "clickhouse" true "ch" {user,
     passwordSecret} override) */}}
{{- define "gpugap.secretFileList" -}}
{{- $v := .root.Values -}}
{{- $out := list -}}
{{- if .kafka -}}
  {{- $ps := $v.kafka.sasl.passwordSecret -}}
  {{- $own := (.c.kafkaSasl | default dict).passwordSecret | default dict -}}
  {{- if $own.name }}{{ $ps = $own }}{{ end -}}
  {{- if $ps.name -}}
    {{- $out = append $out (dict "env" "GPUGAP_KAFKA_SASL_PASSWORD_FILE" "secret" $ps.name "key" ($ps.key | default "password")) -}}
  {{- end -}}
  {{- $ca := $v.kafka.tls.caSecret -}}
  {{- if $ca.name -}}
    {{- $out = append $out (dict "env" "GPUGAP_KAFKA_SSL_CAFILE" "secret" $ca.name "key" ($ca.key | default "ca.crt")) -}}
  {{- end -}}
  {{- $cert := $v.kafka.tls.certSecret -}}
  {{- if $cert.name -}}
    {{- $out = append $out (dict "env" "GPUGAP_KAFKA_SSL_CERTFILE" "secret" $cert.name "key" ($cert.certKey | default "user.crt")) -}}
    {{- $out = append $out (dict "env" "GPUGAP_KAFKA_SSL_KEYFILE" "secret" $cert.name "key" ($cert.keyKey | default "user.key")) -}}
  {{- end -}}
{{- end -}}
{{- if .clickhouse -}}
  {{- $ps := $v.clickhouse.passwordSecret -}}
  {{- $own := (.ch | default dict).passwordSecret | default dict -}}
  {{- if $own.name }}{{ $ps = $own }}{{ end -}}
  {{- if $ps.name -}}
    {{- $out = append $out (dict "env" "GPUGAP_CLICKHOUSE_PASSWORD_FILE" "secret" $ps.name "key" ($ps.key | default "password")) -}}
  {{- end -}}
{{- end -}}
{{- range .c.secretFiles -}}
  {{- if not (hasSuffix "_FILE" (.env | default "")) -}}
    {{- fail (printf "secretFiles: %q is not a *_FILE setting (a secret is passed as a file)" .env) -}}
  {{- end -}}
  {{- if not (and .secret .key) -}}
    {{- fail (printf "secretFiles: %s needs the name of an existing Secret (secret) and its key" .env) -}}
  {{- end -}}
  {{- $out = append $out (dict "env" .env "secret" .secret "key" .key) -}}
{{- end -}}
{{- toJson $out -}}
{{- end }}

{{- define "gpugap.secretPath" -}}
{{- printf "/etc/gpugap/secrets/%s" (. | trimPrefix "GPUGAP_" | trimSuffix "_FILE" | lower | replace "_" "-") -}}
{{- end }}

{{/* The container's env: the shared settings, Kafka's and ClickHouse's where the component
     uses them, its own `env` (which may override the chart's plain ones) and its secret
     files. Same arguments as gpugap.secretFileList, plus "clusterTopics" true and "extra"
     (a dict of settings the template sets). */}}
{{- define "gpugap.env" -}}
{{- $v := .root.Values -}}
{{- $env := dict "GPUGAP_CLUSTER" $v.cluster "GPUGAP_LOG_LEVEL" $v.logLevel -}}
{{- if .kafka -}}
  {{- $_ := set $env "GPUGAP_KAFKA_BOOTSTRAP" $v.kafka.bootstrap -}}
  {{- $_ := set $env "GPUGAP_KAFKA_SECURITY_PROTOCOL" $v.kafka.securityProtocol -}}
  {{- if $v.kafka.topicPrefix }}{{ $_ := set $env "GPUGAP_KAFKA_TOPIC_PREFIX" $v.kafka.topicPrefix }}{{ end -}}
  {{- if $v.kafka.sasl.mechanism -}}
    {{- $_ := set $env "GPUGAP_KAFKA_SASL_MECHANISM" $v.kafka.sasl.mechanism -}}
    {{- $user := (.c.kafkaSasl | default dict).username | default $v.kafka.sasl.username -}}
    {{- if $user }}{{ $_ := set $env "GPUGAP_KAFKA_SASL_USERNAME" $user }}{{ end -}}
  {{- end -}}
  {{- if and .clusterTopics $v.kafka.clusterTopics -}}
    {{- $_ := set $env "GPUGAP_KAFKA_CLUSTER_TOPICS" (toJson $v.kafka.clusterTopics) -}}
  {{- end -}}
{{- end -}}
{{- if .clickhouse -}}
  {{- $_ := set $env "GPUGAP_CLICKHOUSE_URL" $v.clickhouse.url -}}
  {{- $_ := set $env "GPUGAP_CLICKHOUSE_DATABASE" $v.clickhouse.database -}}
  {{- $_ := set $env "GPUGAP_CLICKHOUSE_USER" ((.ch | default dict).user | default $v.clickhouse.user) -}}
{{- end -}}
{{- range $name, $value := (.extra | default dict) -}}
  {{- $_ := set $env $name $value -}}
{{- end -}}
{{- range $name, $value := (.c.env | default dict) -}}
  {{- if regexMatch "(PASSWORD|TOKEN|SECRET|WEBHOOK_URL)$" $name -}}
    {{- fail (printf "env: %s is a secret: name an existing Secret in secretFiles as %s_FILE" $name $name) -}}
  {{- end -}}
  {{- $_ := set $env $name (ternary (toJson $value) (toString $value) (or (kindIs "map" $value) (kindIs "slice" $value))) -}}
{{- end -}}
{{- range (include "gpugap.secretFileList" . | fromJsonArray) -}}
  {{- $_ := set $env .env (include "gpugap.secretPath" .env) -}}
{{- end -}}
{{- range $name := keys $env | sortAlpha }}
- name: {{ $name }}
  value: {{ get $env $name | toString | quote }}
{{- end }}
{{- range $name, $path := (.fieldRefs | default dict) }}
- name: {{ $name }}
  valueFrom: {fieldRef: {fieldPath: {{ $path }}}}
{{- end }}
{{- end }}

{{/* The pod's volumes: /tmp (readOnlyRootFilesystem) and the secret files */}}
{{- define "gpugap.volumes" -}}
- name: tmp
  emptyDir: {sizeLimit: 256Mi}
{{- $files := include "gpugap.secretFileList" . | fromJsonArray }}
{{- if $files }}
- name: secrets
  projected:
    defaultMode: 288  # 0440: the pod's fsGroup reads them
    sources:
      {{- range $files }}
      - secret:
          name: {{ .secret }}
          items:
            - key: {{ .key | quote }}
              path: {{ include "gpugap.secretPath" .env | trimPrefix "/etc/gpugap/secrets/" }}
      {{- end }}
{{- end }}
{{- end }}

{{- define "gpugap.volumeMounts" -}}
- {name: tmp, mountPath: /tmp}
{{- if (include "gpugap.secretFileList" . | fromJsonArray) }}
- {name: secrets, mountPath: /etc/gpugap/secrets, readOnly: true}
{{- end }}
{{- end }}

{{/* Every container: no root filesystem writes, no privilege escalation, no capabilities */}}
{{- define "gpugap.containerSecurityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end }}

{{/* image, command, env, resources, securityContext, volumeMounts of a gpugap container
     (arguments as gpugap.env, plus "resources" where they are not .c.resources) */}}
{{- define "gpugap.container" -}}
{{- $img := .c.image | default dict -}}
image: {{ printf "%s:%s" ($img.repository | default .root.Values.image.repository) ($img.tag | default .root.Values.image.tag | default .root.Chart.AppVersion) | quote }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
command: [gpugap]
env:
  {{- include "gpugap.env" . | trim | nindent 2 }}
resources:
  {{- toYaml (.resources | default .c.resources) | nindent 2 }}
securityContext:
  {{- if .securityContext }}
  {{- toYaml .securityContext | nindent 2 }}
  {{- else }}
  {{- include "gpugap.containerSecurityContext" . | nindent 2 }}
  {{- end }}
volumeMounts:
  {{- include "gpugap.volumeMounts" . | trim | nindent 2 }}
{{- end }}

{{/* Pod-level fields every gpugap pod shares (not the NVML agent's securityContext) */}}
{{- define "gpugap.podSpec" -}}
{{- if .serviceAccountToken }}
automountServiceAccountToken: true  # the Kubernetes producer: the only pod that calls the API
{{- else }}
automountServiceAccountToken: false
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "gpugap.scheduling" .c }}
{{- end }}

{{- define "gpugap.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "gpugap.podAnnotations" -}}
{{- with .podAnnotations -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end }}

{{/* The topics gpugap uses (schemas/topics.py TOPICS; a test keeps them equal) */}}
{{- define "gpugap.topics" -}}
{{- toJson (list "gpu.samples.v1" "slurm.jobs.v1" "k8s.pods.v1" "gpu.allocations.v1" "gpu.minutes.v1" "alerts.v1" "alerts.deliveries.v1" "dead-letter.v1" "recommendations.v1" "transfers.v1" "node-capacity.v1" "queue-quotas.v1" "scheduler-gpu-counts.v1") -}}
{{- end }}

{{/* A cluster's own topics (deploy/kafka-acls/strimzi/topics.yaml) */}}
{{- define "gpugap.clusterTopics" -}}
{{- toJson (list "gpu.samples.v1" "slurm.jobs.v1" "k8s.pods.v1" "transfers.v1" "node-capacity.v1" "queue-quotas.v1" "scheduler-gpu-counts.v1" "dead-letter.v1") -}}
{{- end }}
