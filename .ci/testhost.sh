#!/usr/bin/env bash
# .ci/testhost.sh - start/stop a throw-away Debian host with its own systemd and
# OpenSSH server, for end-to-end tests of the tuner's systemd-over-SSH path.
#
# Usage (as root):
#   .ci/testhost.sh up        # (re)create and boot the host; writes $TH_DIR/env
#   .ci/testhost.sh down      # stop it; kills and removes everything it started
#   .ci/testhost.sh status    # exit 0 if running, 3 if not
#   .ci/testhost.sh ssh [-u USER] [CMD...]   # ssh into the running host
#   .ci/testhost.sh clean     # down + remove the rootfs and state (keeps base+key)
#
# Design: a debootstrap --variant=minbase tree (cached in $TH_BASE) is copied to
# $TH_DIR/rootfs and booted with `systemd-nspawn --boot --register=no --keep-unit`
# inside a cgroup of its own (testhost-$TH_NAME), with host networking; sshd in the
# guest listens on 127.0.0.1:$TH_PORT only. No host device node is ever bound into
# the guest. See .ci/testhost-README.md.
#
# Environment (defaults in brackets):
#   TH_DIR          state dir [<repo>/.ci/.testhost]
#   TH_NAME         machine/host name and cgroup suffix [th1]
#   TH_PORT         sshd port on 127.0.0.1 [2222]
#   TH_BASE         debootstrap cache, reused across runs [$TH_DIR/base]
#   TH_EXTRA_PKGS   extra Debian packages for the guest (space or comma separated)
#   TH_WHEELHOUSE   dir of wheels: installed into a venv at /opt/sglang-emu in the guest
#   TH_SUITE [bookworm]  TH_MIRROR [http://deb.debian.org/debian]
#   TH_BOOT_TIMEOUT [90]  TH_STOP_TIMEOUT [20]  (seconds)
set -Eeuo pipefail
umask 022

SELF=$(readlink -f "${BASH_SOURCE[0]}")
REPO_ROOT=$(cd "$(dirname "$SELF")/.." && pwd -P)

TH_DIR=$(realpath -m "${TH_DIR:-$REPO_ROOT/.ci/.testhost}")
TH_NAME=${TH_NAME:-th1}
TH_PORT=${TH_PORT:-2222}
TH_BASE=$(realpath -m "${TH_BASE:-$TH_DIR/base}")
TH_EXTRA_PKGS=${TH_EXTRA_PKGS:-}
TH_WHEELHOUSE=${TH_WHEELHOUSE:-}
TH_SUITE=${TH_SUITE:-bookworm}
TH_MIRROR=${TH_MIRROR:-http://deb.debian.org/debian}
TH_BOOT_TIMEOUT=${TH_BOOT_TIMEOUT:-90}
TH_STOP_TIMEOUT=${TH_STOP_TIMEOUT:-20}

TH_HOST=127.0.0.1
TH_USER=root
TH_SUDO_USER=tuner
TH_VENV=/opt/sglang-emu
# Bump when the base recipe changes; a base with another stamp is rebuilt.
BASE_RECIPE=1
BASE_PKGS="systemd systemd-sysv dbus openssh-server sudo python3 python3-venv iproute2 procps curl"

ROOTFS=$TH_DIR/rootfs
PIDFILE=$TH_DIR/nspawn.pid
CONSOLE=$TH_DIR/console.log
ENVFILE=$TH_DIR/env
KEY=$TH_DIR/id_ed25519
KNOWN_HOSTS=$TH_DIR/known_hosts
CG_NAME=testhost-$TH_NAME

log() { printf '[testhost] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---- timing ----------------------------------------------------------------
now_us() { local t=${EPOCHREALTIME//[!0-9]/}; echo "$t"; }
fmt_us() { printf '%d.%02ds' $(($1 / 1000000)) $(($1 % 1000000 / 10000)); }
T_START=$(now_us)
TIMINGS=()
PH_NAME=''
PH_T=0
phase() { # phase NAME: ends the running phase (if any) and starts NAME ('' = none)
  if [[ -n $PH_NAME ]]; then
    local d=$(($(now_us) - PH_T))
    log "phase $PH_NAME: $(fmt_us "$d")"
    TIMINGS+=("$PH_NAME=$(fmt_us "$d")")
  fi
  PH_NAME=$1
  PH_T=$(now_us)
}
timing_summary() {
  phase ''
  log "timings: ${TIMINGS[*]} total=$(fmt_us $(($(now_us) - T_START)))"
}

# ---- checks -------------------------------------------------------------------
validate() {
  [[ $TH_NAME =~ ^[A-Za-z0-9][A-Za-z0-9-]{0,30}$ ]] || die "TH_NAME must be [A-Za-z0-9-], at most 31 chars: '$TH_NAME'"
  if ! [[ $TH_PORT =~ ^[0-9]+$ ]] || ((TH_PORT < 1 || TH_PORT > 65535)); then die "bad TH_PORT '$TH_PORT'"; fi
  [[ $TH_BOOT_TIMEOUT =~ ^[0-9]+$ && $TH_STOP_TIMEOUT =~ ^[0-9]+$ ]] || die "timeouts must be integers"
  [[ $TH_DIR != / && $TH_BASE != / && $TH_BASE != "$ROOTFS" ]] || die "refusing TH_DIR=$TH_DIR TH_BASE=$TH_BASE"
}
need_root() { ((EUID == 0)) || die "must run as root"; }

# ---- cgroups ------------------------------------------------------------------
# Hierarchies that track processes: cgroup2 alone, or name=systemd + unified (hybrid).
cg_roots() {
  if [[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]]; then
    echo /sys/fs/cgroup
    return
  fi
  local h
  for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
    [[ -f $h/cgroup.procs ]] && echo "$h"
  done
  return 0
}
cg_dirs() { local r; while read -r r; do [[ -d $r/$CG_NAME ]] && echo "$r/$CG_NAME"; done < <(cg_roots); return 0; }
cg_pids() {
  local d
  while read -r d; do find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null; done < <(cg_dirs) | sort -nu
}

alive() { # a live (non-zombie) process?
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z && $st != X ]]
}
ours() { alive "$1" && grep -qE ":/$CG_NAME(/|$)" "/proc/$1/cgroup" 2>/dev/null; }
nspawn_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && ours "$pid" && echo "$pid"
}

# ---- mounts / removal --------------------------------------------------------
mounts_under() { # mount points at or below $1 (as seen by this mount namespace)
  awk -v d="$1" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo
}
umount_under() {
  local m
  while read -r m; do
    [[ -n $m ]] || continue
    log "WARNING: unmounting leftover mount $m"
    umount -l "$m" || true
  done < <(mounts_under "$1" | sort -r)
}
safe_rm() {
  [[ -e $1 ]] || return 0
  umount_under "$1"
  [[ -z $(mounts_under "$1") ]] || die "mounts remain under $1; not removing it"
  rm -rf --one-file-system -- "$1"
}

# ---- host tools ---------------------------------------------------------------
need_tools() {
  local pkgs=()
  command -v debootstrap >/dev/null || pkgs+=(debootstrap)
  command -v systemd-nspawn >/dev/null || pkgs+=(systemd-container)
  command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || pkgs+=(openssh-client)
  [[ -e /usr/share/keyrings/debian-archive-keyring.gpg ]] || pkgs+=(debian-archive-keyring)
  command -v flock >/dev/null && command -v setsid >/dev/null || pkgs+=(util-linux)
  ((${#pkgs[@]})) || return 0
  log "installing host packages: ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${pkgs[@]}" >/dev/null
}

# ---- base tree (debootstrap, cached) -----------------------------------------
base_stamp() {
  local pkgs
  # shellcheck disable=SC2086 # word splitting wanted
  pkgs=$(printf '%s\n' $BASE_PKGS ${TH_EXTRA_PKGS//,/ } | sort -u | paste -sd, -)
  printf 'recipe=%s\nsuite=%s\npkgs=%s\n' "$BASE_RECIPE" "$TH_SUITE" "$pkgs"
}
make_base() {
  local stamp tmp
  stamp=$(base_stamp)
  mkdir -p "$(dirname "$TH_BASE")"
  exec 8>"$TH_BASE.lock"
  flock -w 1800 8 || die "timeout waiting for $TH_BASE.lock"
  if [[ -f $TH_BASE/etc/testhost-base && $(cat "$TH_BASE/etc/testhost-base") == "$stamp" ]]; then
    log "base: cached at $TH_BASE"
    exec 8>&-
    return 0
  fi
  [[ -e $TH_BASE ]] && log "base: package list or recipe changed; rebuilding $TH_BASE"
  tmp=$TH_BASE.tmp
  safe_rm "$tmp"
  local include
  include=$(sed -n 's/^pkgs=//p' <<<"$stamp")
  log "base: debootstrap --variant=minbase $TH_SUITE from $TH_MIRROR (about a minute)"
  if ! debootstrap --variant=minbase --components=main --include="$include" \
    "$TH_SUITE" "$tmp" "$TH_MIRROR" >"$TH_DIR/debootstrap.log" 2>&1; then
    tail -n 30 "$TH_DIR/debootstrap.log" >&2 || true
    [[ -f $tmp/debootstrap/debootstrap.log ]] && tail -n 30 "$tmp/debootstrap/debootstrap.log" >&2
    safe_rm "$tmp"
    die "debootstrap failed (log: $TH_DIR/debootstrap.log)"
  fi
  umount_under "$tmp"
  rm -f "$tmp"/var/cache/apt/archives/*.deb "$tmp"/etc/ssh/ssh_host_*
  printf '%s\n' "$stamp" >"$tmp/etc/testhost-base"
  safe_rm "$TH_BASE"
  mv "$tmp" "$TH_BASE"
  exec 8>&-
}

# ---- per-host rootfs ------------------------------------------------------------
hostpat() { if ((TH_PORT == 22)); then echo "$1"; else echo "[$1]:$TH_PORT"; fi; }

configure_root() {
  local R=$ROOTFS
  echo "$TH_NAME" >"$R/etc/hostname"
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' "$TH_NAME" >"$R/etc/hosts"
  tr -d '-' </proc/sys/kernel/random/uuid >"$R/etc/machine-id"

  # fresh host key per up, published through known_hosts
  rm -f "$R"/etc/ssh/ssh_host_*
  ssh-keygen -q -t ed25519 -N '' -C "root@$TH_NAME" -f "$R/etc/ssh/ssh_host_ed25519_key"
  local hk
  hk=$(cut -d' ' -f1,2 "$R/etc/ssh/ssh_host_ed25519_key.pub")
  printf '%s %s\n%s %s\n' "$(hostpat 127.0.0.1)" "$hk" "$(hostpat localhost)" "$hk" >"$KNOWN_HOSTS"

  # root login with the client key
  install -d -m 700 "$R/root/.ssh"
  install -m 600 "$KEY.pub" "$R/root/.ssh/authorized_keys"

  # non-root user with passwordless sudo ('*' = no password, but not locked)
  chroot "$R" /usr/sbin/useradd -m -s /bin/bash -p '*' "$TH_SUDO_USER"
  install -d -m 700 "$R/home/$TH_SUDO_USER/.ssh"
  install -m 600 "$KEY.pub" "$R/home/$TH_SUDO_USER/.ssh/authorized_keys"
  chroot "$R" /bin/chown -R "$TH_SUDO_USER:$TH_SUDO_USER" "/home/$TH_SUDO_USER/.ssh"
  printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\n' "$TH_SUDO_USER" >"$R/etc/sudoers.d/testhost"
  chmod 440 "$R/etc/sudoers.d/testhost"

  # sshd: loopback only (host networking), keys only
  cat >"$R/etc/ssh/sshd_config.d/testhost.conf" <<EOF
# written by .ci/testhost.sh
Port $TH_PORT
ListenAddress 127.0.0.1
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
EOF

  # no background apt/dpkg jobs in the guest
  local t
  for t in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer man-db.timer; do
    ln -sfn /dev/null "$R/etc/systemd/system/$t"
  done
}

# ---- boot / wait ----------------------------------------------------------------
# Internal: runs (under setsid) as the future nspawn process, inside our own cgroup.
cmd__nspawn() {
  local d
  for d in $(cg_dirs); do echo $$ >"$d/cgroup.procs"; done
  echo $$ >"$PIDFILE"
  exec systemd-nspawn --boot --directory="$ROOTFS" --machine="$TH_NAME" \
    --register=no --keep-unit --console=read-only --link-journal=no
}

boot() {
  local r
  [[ -n $(cg_roots) ]] || die "no usable cgroup hierarchy under /sys/fs/cgroup"
  while read -r r; do mkdir -p "$r/$CG_NAME"; done < <(cg_roots)
  rm -f "$PIDFILE"
  : >"$CONSOLE"
  TH_DIR=$TH_DIR TH_NAME=$TH_NAME setsid bash "$SELF" _nspawn </dev/null >>"$CONSOLE" 2>&1 8>&- 9>&- &
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s $PIDFILE ]] && break
    sleep 0.05
  done
  [[ -s $PIDFILE ]] || die "nspawn wrapper did not start"
}

SSH_BASE=()
ssh_opts() {
  SSH_BASE=(ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$KNOWN_HOSTS"
    -o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o IdentityFile="$KEY"
    -o ConnectTimeout=5 -o LogLevel=ERROR -p "$TH_PORT")
}
gssh() { "${SSH_BASE[@]}" "$TH_USER@$TH_HOST" "$@" </dev/null; }

console_tail() {
  log "---- console tail ($CONSOLE) ----"
  tail -n "${1:-40}" "$CONSOLE" 2>/dev/null | sed 's/\x1b\[[0-9;]*[A-Za-z]//g' >&2 || true
  log "---- end of console ----"
}

wait_ready() {
  local deadline=$(($(now_us) + TH_BOOT_TIMEOUT * 1000000)) st=''
  while :; do
    local pid
    pid=$(nspawn_pid) || {
      console_tail
      die "systemd-nspawn exited during boot"
    }
    st=$(gssh systemctl is-system-running 2>&1) || true
    case $st in
    running) return 0 ;;
    degraded)
      log "WARNING: guest is degraded; failed units:"
      gssh systemctl --failed --no-legend --plain >&2 || true
      return 0
      ;;
    esac
    if (($(now_us) > deadline)); then
      console_tail 60
      die "guest not ready after ${TH_BOOT_TIMEOUT}s (last answer: ${st:-none})"
    fi
    sleep 0.1
  done
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

install_wheels() {
  gssh "set -e; python3 -m venv $TH_VENV; $TH_VENV/bin/pip install -q --disable-pip-version-check \
--no-index --no-deps --find-links /opt/wheelhouse /opt/wheelhouse/*.whl" >&2
}

write_env() {
  local tmp=$ENVFILE.tmp
  {
    printf 'TH_HOST=%q\n' "$TH_HOST"
    printf 'TH_PORT=%q\n' "$TH_PORT"
    printf 'TH_USER=%q\n' "$TH_USER"
    printf 'TH_SUDO_USER=%q\n' "$TH_SUDO_USER"
    printf 'TH_KEY=%q\n' "$KEY"
    printf 'TH_KNOWN_HOSTS=%q\n' "$KNOWN_HOSTS"
    printf 'TH_NAME=%q\n' "$TH_NAME"
    [[ -z $TH_WHEELHOUSE ]] || printf 'TH_VENV=%q\n' "$TH_VENV"
  } >"$tmp"
  mv "$tmp" "$ENVFILE"
}

# ---- commands -----------------------------------------------------------------
lock_dir() {
  mkdir -p "$TH_DIR"
  exec 9>"$TH_DIR/.lock"
  flock -w 120 9 || die "another testhost.sh holds $TH_DIR/.lock"
}

UP_DONE=0
up_exit() {
  local rc=$?
  ((UP_DONE)) && return 0
  log "up failed (rc=$rc); cleaning up"
  do_down || true
  exit "$rc"
}

cmd_up() {
  need_root
  lock_dir
  log "TH_DIR=$TH_DIR"
  if [[ -n $TH_WHEELHOUSE ]]; then
    compgen -G "$TH_WHEELHOUSE/*.whl" >/dev/null || die "TH_WHEELHOUSE=$TH_WHEELHOUSE has no *.whl"
  fi
  if [[ -n $(cg_pids) || -e $PIDFILE ]]; then
    phase down-previous
    log "host $TH_NAME is (or was) running; taking it down first"
    do_down
  fi
  rm -f "$ENVFILE"
  ! port_busy "$TH_PORT" || die "127.0.0.1:$TH_PORT is already in use by another process (see: ss -ltnp)"
  trap up_exit EXIT

  phase host-tools
  need_tools
  [[ -f $KEY && -f $KEY.pub ]] || ssh-keygen -q -t ed25519 -N '' -C "testhost-client" -f "$KEY"

  phase base
  make_base

  phase rootfs-remove-old
  safe_rm "$ROOTFS"

  phase rootfs-copy
  cp -a --reflink=auto "$TH_BASE" "$ROOTFS"

  phase configure
  configure_root
  if [[ -n $TH_WHEELHOUSE ]]; then
    install -d "$ROOTFS/opt/wheelhouse"
    cp -a "$TH_WHEELHOUSE"/. "$ROOTFS/opt/wheelhouse/"
  fi

  phase boot-to-ready
  ssh_opts
  boot
  wait_ready
  log "guest $TH_NAME is up: nspawn pid $(cat "$PIDFILE"), ssh $TH_USER@$TH_HOST -p $TH_PORT"

  if [[ -n $TH_WHEELHOUSE ]]; then
    phase wheelhouse
    install_wheels
  fi

  write_env
  UP_DONE=1
  trap - EXIT
  timing_summary
  log "env file: $ENVFILE"
  cat "$ENVFILE"
}

do_down() {
  local pid i
  if pid=$(nspawn_pid); then
    log "stopping nspawn pid $pid (SIGTERM -> orderly poweroff)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < TH_STOP_TIMEOUT * 10; i++)); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      log "WARNING: nspawn still alive after ${TH_STOP_TIMEOUT}s; SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  # Whatever is left in our cgroups (e.g. the guest after nspawn was SIGKILLed).
  local pids d
  for ((i = 0; i < 100; i++)); do
    pids=$(cg_pids)
    [[ -n $pids ]] || break
    ((i)) || log "killing leftover processes: ${pids//$'\n'/ }"
    while read -r d; do # cgroup2: kill the whole subtree at once (no fork races)
      if [[ -f $d/cgroup.kill ]]; then echo 1 >"$d/cgroup.kill" 2>/dev/null || true; fi
    done < <(cg_dirs)
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  pids=$(cg_pids)
  [[ -z $pids ]] || log "WARNING: processes still in $CG_NAME: ${pids//$'\n'/ }"
  while read -r d; do
    for ((i = 0; i < 50; i++)); do
      find "$d" -depth -type d -exec rmdir {} + 2>/dev/null && break
      sleep 0.1
    done
    [[ ! -d $d ]] || log "WARNING: could not remove cgroup $d"
  done < <(cg_dirs)
  rm -rf "/run/systemd/nspawn/propagate/$TH_NAME"
  # image lock that a SIGKILLed nspawn leaves behind (named after the rootfs inode)
  [[ ! -d $ROOTFS ]] || rm -f "/run/systemd/nspawn/locks/inode-$(stat -c %d:%i "$ROOTFS")"
  rm -f "$PIDFILE" "$ENVFILE" "$TH_DIR/.#rootfs.lck" "$TH_DIR/.#rootfs"*
  if [[ -n $(mounts_under "$TH_DIR") ]]; then
    log "WARNING: mounts left under $TH_DIR; unmounting"
    umount_under "$TH_DIR"
  fi
}

cmd_down() {
  need_root
  lock_dir
  log "TH_DIR=$TH_DIR"
  phase down
  do_down
  timing_summary
}

cmd_clean() {
  cmd_down
  safe_rm "$ROOTFS"
  rm -f "$KNOWN_HOSTS" "$CONSOLE" "$TH_DIR/debootstrap.log"
  log "removed rootfs and state (kept $TH_BASE and $KEY)"
}

# status/ssh: the port of the running host is the one recorded in its env file.
port_from_env() {
  local p
  p=$(sed -n 's/^TH_PORT=//p' "$ENVFILE" 2>/dev/null) || true
  [[ -z $p ]] || TH_PORT=$p
}

cmd_status() {
  log "TH_DIR=$TH_DIR"
  local pid n
  n=$(cg_pids | wc -l)
  if pid=$(nspawn_pid); then
    port_from_env
    ssh_opts
    local st
    st=$(gssh systemctl is-system-running 2>&1) || true
    echo "running: name=$TH_NAME nspawn_pid=$pid processes=$n ssh=127.0.0.1:$TH_PORT system=${st:-unreachable}"
    return 0
  fi
  if ((n > 0)); then
    echo "crashed: nspawn is gone but $n processes remain in $CG_NAME (run: $0 down)"
  else
    echo "stopped: name=$TH_NAME"
  fi
  return 3
}

cmd_ssh() {
  [[ -f $ENVFILE ]] || die "no $ENVFILE: is the host up?"
  if [[ ${1:-} == -u ]]; then
    TH_USER=$2
    shift 2
  fi
  [[ ${1:-} != -- ]] || shift
  port_from_env
  ssh_opts
  exec "${SSH_BASE[@]}" "$TH_USER@$TH_HOST" "$@"
}

usage() { sed -n '2,/^set -E/p' "$SELF" | sed '$d; s/^# \{0,1\}//' >&2; }

main() {
  validate
  case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  clean) cmd_clean ;;
  ssh)
    shift
    cmd_ssh "$@"
    ;;
  _nspawn) cmd__nspawn ;;
  -h | --help | help)
    usage
    ;;
  *)
    usage
    exit 2
    ;;
  esac
}

main "$@"
