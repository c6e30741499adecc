#!/bin/sh
# An example scale hook for a swarm elastic pool (docs/operations.md, "Elastic fleets").
#
# Install it root-owned, mode 0755, on EVERY agent that carries the pool's
# [scale.NAME] table (whichever of them holds the pool's seat runs the hook, so each
# needs the script and the cloud credentials it uses), and name it in agent.toml:
#
#   [scale.gpu]
#   scale-out-command = "/etc/swarm/scale-hook.sh"
#   scale-in-command = "/etc/swarm/scale-hook.sh"
#
# Try it first with the cloud left alone (it only logs what it would do):
#
#   scale-out-command = "SCALE_HOOK_DRY_RUN=1 /etc/swarm/scale-hook.sh"
#
# The agent runs the command line with /bin/sh -c, as the agent's user, in /, with
# stdin from /dev/null and an environment of PATH, LANG, HOME and these only (none of
# the agent's own variables: settings for this script go in front of it in the
# command line, as above):
#
#   SWARM_SCALE_POOL     the pool (the NAME of [scale.NAME])
#   SWARM_SCALE_ACTION   out or in
#   SWARM_SCALE_COUNT    how many nodes to add (out) or remove (in)
#   SWARM_SCALE_NODES    in: the swarm node ids to remove, separated by single
#                        spaces (already drained); out: empty
#   SWARM_SCALE_DESIRED  in: the pool's node count once they are gone; out: the count
#                        the pool is heading to, which may be more than now + COUNT
#                        (max-step holds each action back)
#   SWARM_SCALE_EPOCH    the acting node's lease epoch (larger for each new holder)
#   SWARM_SCALE_ACTOR    the acting node's id
#   SWARM_SCALE_ATTEMPT  0 on the first attempt, 1, 2, ... on retries of the same action
#
# Exit status 0 means done. Any other status, or running past hook-timeout (the whole
# process group is then killed), is a failure: the agent tries again after
# hook-backoff, doubled on each retry, up to hook-retries times, then gives the action
# up (a scale-in's nodes are undrained and kept). The last 4096 bytes of the output
# (stdout and stderr together) show in `swarm scale status`; this script logs to
# stderr.
#
# Be idempotent: the same action can come more than once. A retry follows an attempt
# that may have acted before it failed or timed out; after a hand-over, or on both
# sides of a network partition, another node may ask for the same nodes again. So
# removing a node that is already gone succeeds, and an addition is made absolute
# (a target capacity) rather than "COUNT more" wherever the cloud allows it.
#
# Never trust the names blindly: a node holding the cluster key can make the actor
# name any node. Check each against your own inventory (the pool's group) before you
# delete anything.

set -eu
set -f # node ids are split on spaces below: never expand them as file patterns

log() {
    printf 'scale-hook pool=%s action=%s epoch=%s actor=%s attempt=%s: %s\n' \
        "${SWARM_SCALE_POOL:-?}" "${SWARM_SCALE_ACTION:-?}" "${SWARM_SCALE_EPOCH:-?}" \
        "${SWARM_SCALE_ACTOR:-?}" "${SWARM_SCALE_ATTEMPT:-?}" "$*" >&2
}

fail() {
    log "error: $*"
    exit 1
}

# Run a command, or only log it with SCALE_HOOK_DRY_RUN=1.
run() {
    if [ "${SCALE_HOOK_DRY_RUN:-0}" = 1 ]; then
        log "dry run: $*"
        return 0
    fi
    log "run: $*"
    "$@"
}

is_count() {
    case $1 in
        '' | *[!0-9]*) return 1 ;;
    esac
    return 0
}

pool=${SWARM_SCALE_POOL:-}
action=${SWARM_SCALE_ACTION:-}
count=${SWARM_SCALE_COUNT:-}
nodes=${SWARM_SCALE_NODES:-}
desired=${SWARM_SCALE_DESIRED:-}

[ -n "$pool" ] || fail "SWARM_SCALE_POOL is not set: this script is run by a swarm agent"
case $pool in
    *[!a-z0-9_.-]*) fail "unexpected pool name: $pool" ;;
esac
is_count "$count" || fail "SWARM_SCALE_COUNT is not a count: $count"
is_count "$desired" || fail "SWARM_SCALE_DESIRED is not a count: $desired"

# The cloud's name for this pool's machines (adapt): an autoscaling group, a
# Terraform workspace, a managed instance group.
group=${SCALE_HOOK_GROUP:-swarm-$pool}
# Where the example keeps the target of a scale-out across retries.
state_dir=${SCALE_HOOK_STATE:-/var/lib/swarm-scale-hook}

not_configured() {
    if [ "${SCALE_HOOK_DRY_RUN:-0}" = 1 ]; then
        return 0
    fi
    fail "no cloud command configured: edit $0 ($1), or try SCALE_HOOK_DRY_RUN=1"
}

scale_out() {
    log "adding $count node(s) to $group (the pool is heading to $desired)"
    target_file=$state_dir/$pool.out-target
    # AWS Auto Scaling: set an absolute desired capacity. The first attempt computes
    # it and records it; a retry reuses it, so an attempt that acted and then timed
    # out is not repeated on top of itself.
    #
    # if [ "${SWARM_SCALE_ATTEMPT:-0}" -gt 0 ] && [ -s "$target_file" ]; then
    #     target=$(cat "$target_file")
    # else
    #     current=$(aws autoscaling describe-auto-scaling-groups \
    #         --auto-scaling-group-names "$group" \
    #         --query 'AutoScalingGroups[0].DesiredCapacity' --output text) ||
    #         fail "cannot read the capacity of $group"
    #     is_count "$current" || fail "unexpected capacity of $group: $current"
    #     target=$((current + count))
    #     mkdir -p "$state_dir"
    #     printf '%s\n' "$target" >"$target_file"
    # fi
    # run aws autoscaling set-desired-capacity --auto-scaling-group-name "$group" \
    #     --desired-capacity "$target" || fail "set-desired-capacity $group $target failed"
    #
    # Terraform, with the pool's size as a variable (apply is declarative: the
    # same value again changes nothing):
    #
    # run terraform -chdir="/etc/swarm/terraform/$pool" apply -input=false \
    #     -auto-approve -var "node_count=$desired" || fail "terraform apply failed"
    #
    # (Passing $desired here lets one action add more than max-step nodes: pass
    # your own count plus $count instead if the bound matters to you.)
    log "target file for retries: $target_file"
    not_configured "scale_out"
}

remove_node() {
    node=$1
    log "removing $node from $group"
    # Look the node up in the pool's own inventory first; a node that is not there
    # (already removed, or not ours) is left alone, and counts as done.
    #
    # id=$(aws ec2 describe-instances \
    #     --filters "Name=tag:Name,Values=$node" \
    #     "Name=tag:aws:autoscaling:groupName,Values=$group" \
    #     "Name=instance-state-name,Values=pending,running" \
    #     --query 'Reservations[].Instances[].InstanceId' --output text) ||
    #     fail "cannot look $node up in $group"
    # if [ -z "$id" ] || [ "$id" = None ]; then
    #     log "$node is not a running instance of $group: nothing to do"
    #     return 0
    # fi
    # run aws autoscaling terminate-instance-in-auto-scaling-group \
    #     --instance-id "$id" --should-decrement-desired-capacity ||
    #     fail "cannot terminate $node ($id)"
    not_configured "remove_node"
}

scale_in() {
    [ -n "$nodes" ] || fail "a scale-in with no node named"
    old_ifs=$IFS
    IFS=' '
    # shellcheck disable=SC2086 # split on spaces on purpose; globbing is off (set -f)
    set -- $nodes
    IFS=$old_ifs
    [ "$#" -eq "$count" ] || fail "SWARM_SCALE_COUNT is $count but $# node(s) are named"
    for node in "$@"; do
        case $node in
            '' | -* | *[!A-Za-z0-9._-]*) fail "refusing the node id '$node'" ;;
        esac
    done
    for node in "$@"; do
        remove_node "$node"
    done
    log "removed $count node(s); the pool is heading to $desired"
}

case $action in
    out) scale_out ;;
    in) scale_in ;;
    *) fail "unknown SWARM_SCALE_ACTION: '$action'" ;;
esac
