#!/usr/bin/env bash
# gpugap's Kafka ACLs, one principal per part (docs/kafka-trust.md):
#
#   User:<cluster>        each cluster's producers: write the cluster's own topics only
#                         (<prefix><cluster>.gpu.samples.v1, .slurm.jobs.v1, .k8s.pods.v1,
#                         .transfers.v1, .node-capacity.v1, .queue-quotas.v1,
#                         .scheduler-gpu-counts.v1, .dead-letter.v1: one PREFIXED ACL
#                         on "<cluster>.")
#   User:gpugap-worker    reads the inputs (shared and per cluster), is the only writer of
#                         gpu.allocations.v1, gpu.minutes.v1 and alerts.v1, owns its state
#                         topics and consumer group (both named after the group)
#   User:gpugap-sink      reads what the ClickHouse sink stores, writes dead letters
#   User:gpugap-notify    reads alerts.v1, reads and writes alerts.deliveries.v1
#   User:gpugap-recommend writes recommendations.v1
#
# Nobody writes the shared inputs (gpu.samples.v1, slurm.jobs.v1, k8s.pods.v1, transfers.v1,
# node-capacity.v1, queue-quotas.v1, scheduler-gpu-counts.v1)
# unless SHARED_PRODUCERS names principals for them. Give the worker and the sink
#   GPUGAP_KAFKA_CLUSTER_TOPICS='{"cluster-a.*": "cluster-a", "cluster-b.*": "cluster-b"}'
# and each cluster's producers GPUGAP_KAFKA_TOPIC_PREFIX=<prefix><cluster>.
#
# Usage:
#   CLUSTERS="cluster-a cluster-b" BOOTSTRAP=broker:9093 COMMAND_CONFIG=admin.properties \
#     ./kafka-acls.sh            # add the ACLs with Kafka's kafka-acls.sh (as a super user)
#   CLUSTERS=... ./kafka-acls.sh --print   # the kafka-acls.sh commands, run nothing
#   CLUSTERS=... ./kafka-acls.sh --list    # one ACL a line: PRINCIPAL OPERATION TYPE NAME PATTERN
#
# Settings (environment):
#   CLUSTERS                  the cluster names, space-separated (required)
#   GPUGAP_KAFKA_TOPIC_PREFIX the namespace every gpugap topic carries (default: none)
#   PRODUCER_USER_PREFIX      principal of a cluster's producers: User:<this><cluster>
#   WORKER_PRINCIPAL, SINK_PRINCIPAL, NOTIFY_PRINCIPAL, RECOMMEND_PRINCIPAL  (defaults above)
#   WORKER_GROUP              the worker's --group (default gpugap-worker)
#   SHARED_PRODUCERS          principals that may still write the shared inputs (default none)
#   KAFKA_ACLS                kafka-acls.sh (default: on PATH, else $KAFKA_HOME/bin)
#   BOOTSTRAP, COMMAND_CONFIG --bootstrap-server and --command-config of kafka-acls.sh
#
# Idempotent: adding an ACL that exists changes nothing. Brokers before Kafka 2.8 also want
# IdempotentWrite on the cluster for every producer (gpugap's producers are idempotent).
set -euo pipefail

mode=apply
case "${1:-}" in
  "") ;;
  --print) mode=print ;;
  --list) mode=list ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 [--print | --list]" >&2; exit 2 ;;
esac

read -r -a clusters <<< "${CLUSTERS:-}"
if [ "${#clusters[@]}" -eq 0 ]; then
  echo "$0: set CLUSTERS to the cluster names (CLUSTERS=\"cluster-a cluster-b\")" >&2
  exit 2
fi
for c in "${clusters[@]}"; do
  if ! [[ $c =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "$0: cluster $c: a topic name may hold letters, digits, '.', '_' and '-' only" >&2
    exit 2
  fi
  for d in "${clusters[@]}"; do
    # a PREFIXED ACL on "a." also covers "a.b.gpu.samples.v1": cluster a could write b's
    if [ "$c" != "$d" ] && [[ $d == "$c."* ]]; then
      echo "$0: cluster $c's topics ($c.*) would include cluster $d's: rename one" >&2
      exit 2
    fi
  done
done

P=${GPUGAP_KAFKA_TOPIC_PREFIX:-}
worker=${WORKER_PRINCIPAL:-User:gpugap-worker}
sink=${SINK_PRINCIPAL:-User:gpugap-sink}
notify=${NOTIFY_PRINCIPAL:-User:gpugap-notify}
recommend=${RECOMMEND_PRINCIPAL:-User:gpugap-recommend}
group=${WORKER_GROUP:-gpugap-worker}
read -r -a shared_producers <<< "${SHARED_PRODUCERS:-}"

tool=${KAFKA_ACLS:-}
if [ -z "$tool" ]; then
  tool=$(command -v kafka-acls.sh || command -v kafka-acls || true)
  [ -n "$tool" ] || tool=${KAFKA_HOME:+$KAFKA_HOME/bin/kafka-acls.sh}
fi

# acl PRINCIPAL TYPE(topic|group) NAME PATTERN(literal|prefixed) OPERATION...
acl() {
  local principal=$1 type=$2 name=$3 pattern=$4
  shift 4
  if [ "$mode" = list ]; then
    local op
    for op in "$@"; do
      echo "$principal $op ${type^} $name ${pattern^}"
    done
    return
  fi
  local cmd=("${tool:-kafka-acls.sh}" --bootstrap-server "${BOOTSTRAP:-127.0.0.1:9092}")
  [ -z "${COMMAND_CONFIG:-}" ] || cmd+=(--command-config "$COMMAND_CONFIG")
  cmd+=(--add --allow-principal "$principal")
  local op
  for op in "$@"; do cmd+=(--operation "$op"); done
  cmd+=("--$type" "$name" --resource-pattern-type "$pattern")
  if [ "$mode" = print ]; then
    printf '%q ' "${cmd[@]}"
    echo
  else
    if [ -z "$tool" ]; then
      echo "$0: kafka-acls.sh not found: set KAFKA_ACLS or KAFKA_HOME" >&2
      exit 2
    fi
    "${cmd[@]}" > /dev/null
  fi
}

inputs=(gpu.samples.v1 slurm.jobs.v1 k8s.pods.v1)
outputs=(gpu.allocations.v1 gpu.minutes.v1 alerts.v1)
sink_reads=(gpu.minutes.v1 slurm.jobs.v1 k8s.pods.v1 transfers.v1 alerts.v1 alerts.deliveries.v1
  dead-letter.v1 recommendations.v1 node-capacity.v1 queue-quotas.v1 scheduler-gpu-counts.v1)

# each cluster's producers: its own topics, nothing else
for c in "${clusters[@]}"; do
  acl "User:${PRODUCER_USER_PREFIX:-}$c" topic "$P$c." prefixed Write Describe
done
for principal in "${shared_producers[@]}"; do
  for t in "${inputs[@]}" transfers.v1 node-capacity.v1 queue-quotas.v1 scheduler-gpu-counts.v1; do
    acl "$principal" topic "$P$t" literal Write Describe
  done
done

# the worker
for t in "${inputs[@]}"; do
  acl "$worker" topic "$P$t" literal Read Describe
done
for c in "${clusters[@]}"; do
  acl "$worker" topic "$P$c." prefixed Read Describe
done
for t in "${outputs[@]}" dead-letter.v1; do
  acl "$worker" topic "$P$t" literal Write Describe
done
# its state and idle-episodes topics (and the Faust engine's leader topic) start with the
# group's name; it creates them on its first run
acl "$worker" topic "$P$group" prefixed Create Read Write Describe DescribeConfigs
acl "$worker" group "$P$group" prefixed Read
if [ -n "$P" ]; then  # the asyncio engine's consumer group carries no prefix
  acl "$worker" group "$group" prefixed Read
fi

# the ClickHouse sink
for t in "${sink_reads[@]}"; do
  acl "$sink" topic "$P$t" literal Read Describe
done
for c in "${clusters[@]}"; do
  acl "$sink" topic "$P$c." prefixed Read Describe
done
acl "$sink" topic "${P}dead-letter.v1" literal Write
acl "$sink" group gpugap-sink- prefixed Read

# the alert notifier (gpugap notify ...)
acl "$notify" topic "${P}alerts.v1" literal Read Describe
acl "$notify" topic "${P}alerts.deliveries.v1" literal Read Write Describe
acl "$notify" topic "${P}dead-letter.v1" literal Write Describe
acl "$notify" group gpugap-notify- prefixed Read

# recommendations for people to review
acl "$recommend" topic "${P}recommendations.v1" literal Write Describe
