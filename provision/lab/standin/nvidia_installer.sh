#!/bin/sh
# provision lab: stands in for NVIDIA-Linux-x86_64-@VERSION@.run (provision/lab/wheelhouse.py builds it; docs/lab.md
# says what it copies). Derived from NVIDIA/nvidia-installer 590.48.01, read, not copied:
# - option_table.h: the options it knows (below, long names; `--no-X` for the boolean ones), `--silent` implying
#   `--ui=none --no-questions`; common-utils/nvgetopt.c: an unknown option prints `<argv0>: unrecognized option:
#   "<opt>"` and nvidia-installer.c then exits 1;
# - it must run as root;
# - misc.c check_for_nouveau: nouveau in use aborts the install (unless --no-nouveau-check);
# - kernel.c: a loaded NVIDIA module that cannot be removed aborts a --no-questions install unless
#   --allow-installation-with-running-driver; then the module load is skipped ("reboot your computer");
# - misc.c dkms_register_module/dkms_gen_tarball: with --dkms the sources go to /usr/src/nvidia-<ver> and the built
#   modules into the DKMS tree (`dkms ldtarball`, `dkms install`): /var/lib/dkms/nvidia/<ver>/source,
#   <ver>/<kernel>/<arch>/{module,log/make.log}, and the kernel-<kernel>-<arch> link that marks them installed
#   (dell/dkms dkms.in _is_module_installed). The lab has no dkms package: the tree is written as `dkms ldtarball`
#   and `dkms install` leave it, and the lab's `dkms status` stand-in reads it.
# - its log: nvidia-installer.h DEFAULT_LOG_FILE_NAME /var/log/nvidia-installer.log, or --log-file-name; log.c
#   log_init opens it for writing ("w": each run replaces the last one's) once the options are parsed, and a root-only
#   path it cannot open only disables logging; user-interface.c message_helper/level_str log every error as a line
#   `ERROR: <message>`; install-from-cwd.c ends a failed install with the error "Installation has failed.  Please see
#   the file '<log>' for details. ...".
# With --no-kernel-module(s) (a container) only the userspace: nvidia-smi reporting this version.
# What it cannot do: build or load a real module. "Loading" is the lab's fake driver (fake-nvidia.sh), which shows
# the version DKMS has installed for the running kernel in /proc/driver/nvidia/version.
set -eu
VERSION=@VERSION@
ARCH=$(uname -m)
KERNEL=$(uname -r)
LOG=/var/log/nvidia-installer.log logging=0
log() { [ "$logging" = 0 ] || printf '%s\n' "$@" >> "$LOG"; }
fail() {  # ui_error's message, then install-from-cwd.c's closing one; on stderr (errors show even with --silent)
  see=""
  [ "$logging" = 0 ] || see="Please see the file '$LOG' for details.  "
  for msg in "$*" "Installation has failed.  ${see}You may find suggestions on fixing installation problems in the \
README available on the Linux driver download page at www.nvidia.com."; do
    echo "ERROR: $msg" >&2
    log "ERROR: $msg"
  done
  exit 1
}
silent=0 kernel_module=1 dkms=0 nouveau_check=1 allow_running=0 module_load=1
while [ $# -gt 0 ]; do
  opt=$1; shift
  case $opt in
    -s|--silent) silent=1 ;;
    -q|--no-questions|-a|--accept-license|-N|--no-network|--no-x-check|--no-nvidia-modprobe|--no-backup) ;;
    --no-kernel-module|--no-kernel-modules) kernel_module=0 ;;
    --dkms) dkms=1 ;;
    --no-dkms) dkms=0 ;;
    -z|--no-nouveau-check) nouveau_check=0 ;;
    -Z|--disable-nouveau|--no-disable-nouveau) ;;
    --allow-installation-with-running-driver) allow_running=1 ;;
    --no-allow-installation-with-running-driver) allow_running=0 ;;
    --skip-module-load) module_load=0 ;;
    --skip-module-unload|--no-kernel-module-source|--no-opengl-files|--no-wine-files|--no-distro-scripts) ;;
    --no-drm|--no-peermem|--no-unified-memory|--no-install-compat32-libs|--install-compat32-libs) ;;
    --rebuild-initramfs|--no-rebuild-initramfs|--no-rpms|--no-abi-note|--no-precompiled-interface) ;;
    --ui=none|--ui=ncurses|--kernel-module-type=open|--kernel-module-type=proprietary|-M=open|-M=proprietary) ;;
    --log-file-name=*) LOG=${opt#--log-file-name=} ;;
    --log-file-name) [ $# -gt 0 ] || fail "option $opt needs an argument"; LOG=$1; shift ;;
    --tmpdir=*|--kernel-name=*|--kernel-source-path=*|--kernel-output-path=*|--utility-prefix=*) ;;
    --ui|-M|--kernel-module-type|--tmpdir|--kernel-name|--kernel-source-path)
      [ $# -gt 0 ] || fail "option $opt needs an argument"; shift ;;
    *) echo "nvidia-installer: unrecognized option: \"$opt\"" >&2; exit 1 ;;
  esac
done
if { : > "$LOG"; } 2>/dev/null; then
  logging=1
  log "nvidia-installer log file '$LOG'" "creation time: $(date)" "installer version: $VERSION" ""
else
  echo "nvidia-installer: Error opening log file '$LOG' for writing; disabling logging." >&2
fi
[ "$(id -u)" = 0 ] || fail "nvidia-installer must be run as root"
say() { [ "$silent" = 1 ] || echo "$*"; }

install_userspace() {
  mkdir -p /etc/lab /usr/bin
  echo "$VERSION" > /etc/lab/driver_version
  cat > /usr/bin/nvidia-smi <<'SHIM'
@SMI@SHIM
  chmod 0755 /usr/bin/nvidia-smi
}

install_persistenced() {  # the real .run installs the daemon, not its unit
  cat > /usr/bin/nvidia-persistenced <<'DAEMON'
#!/bin/sh
# lab stand-in for nvidia-persistenced: needs root and the module, forks and keeps running (Type=forking)
[ "$(id -u)" = 0 ] || { echo "nvidia-persistenced: must be run as root" >&2; exit 1; }
[ -e /proc/driver/nvidia/version ] || { echo "nvidia-persistenced: failed to open /proc/driver/nvidia" >&2; exit 1; }
mkdir -p /var/run/nvidia-persistenced
setsid sh -c 'echo $$ > /var/run/nvidia-persistenced/nvidia-persistenced.pid; exec sleep infinity' \
  </dev/null >/dev/null 2>&1 &
exit 0
DAEMON
  chmod 0755 /usr/bin/nvidia-persistenced
}

remove_previous() {  # the previous .run install is uninstalled first, its DKMS module removed (backup.c)
  for old in /var/lib/dkms/nvidia/*/source; do
    [ -e "$old" ] || [ -L "$old" ] || continue
    v=$(basename "$(dirname "$old")")
    [ "$v" = "$VERSION" ] && continue
    rm -rf "/var/lib/dkms/nvidia/$v" "/usr/src/nvidia-$v"
    for link in /var/lib/dkms/nvidia/kernel-*; do
      case $(readlink "$link" 2>/dev/null) in "$v"/*) rm -f "$link" ;; esac
    done
  done
}

register_dkms() {
  src=/usr/src/nvidia-$VERSION tree=/var/lib/dkms/nvidia built=/var/lib/dkms/nvidia/$VERSION/$KERNEL/$ARCH
  mkdir -p "$src" "$built/module" "$built/log"
  printf 'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="%s"\nAUTOINSTALL="yes"\n' "$VERSION" > "$src/dkms.conf"
  printf 'This driver was linked from precompiled interfaces and directly registered with DKMS (lab stand-in).\n' \
    > "$built/log/make.log"
  for m in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do
    printf 'lab stand-in for %s.ko, version=%s\n' "$m" "$VERSION" > "$built/module/$m.ko"
  done
  ln -sfn "$src" "$tree/$VERSION/source"
  ln -sfn "$VERSION/$KERNEL/$ARCH" "$tree/kernel-$KERNEL-$ARCH"
}

if [ "$kernel_module" = 0 ]; then
  install_userspace
  say "Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: $VERSION) is now complete."
  exit 0
fi
if [ "$nouveau_check" = 1 ] && grep -qs '^nouveau ' /proc/modules; then
  fail "The Nouveau kernel driver is currently in use by your system.  This driver is incompatible with the NVIDIA" \
    "driver, and must be disabled before proceeding."
fi
running=0
if [ -e /proc/driver/nvidia/version ]; then  # the lab's module cannot be removed: rmmod fails, as for a held one
  running=1
  [ "$allow_running" = 1 ] || fail "An NVIDIA kernel module 'nvidia' appears to be already loaded in your kernel." \
    "Please close any programs which may be using the NVIDIA GPU(s), and attempt installation again."
  say "WARNING: Continuing installation despite the presence of a loaded NVIDIA kernel module. It is strongly" \
    "recommended that you reboot your computer after installation is complete."
fi
remove_previous
install_userspace
install_persistenced
[ "$dkms" = 1 ] && register_dkms
if [ "$running" = 0 ] && [ "$module_load" = 1 ] && [ "$dkms" = 1 ]; then
  /usr/local/lib/lab/fake-nvidia.sh
fi
say "Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: $VERSION) is now complete."
