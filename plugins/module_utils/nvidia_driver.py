"""The node's NVIDIA driver: the rules for the inventory's pin, what a node reports about its driver, and what to do
about it (install, upgrade, load, reboot). Pure functions, used by the nvidia_driver_info module on the node and by
`provision inventory check` on the controller (provision.paths.module_util): one rule, one place.

Sources, read, not copied:
- the floor: CUDA 13.0 Toolkit release notes (docs.nvidia.com/cuda/archive/13.0.0/cuda-toolkit-release-notes),
  table "CUDA Toolkit and Corresponding Driver Versions": CUDA 13.0 GA, Linux x86_64, ">= 580.65.06"; the CUDA
  compatibility guide (docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html, Table 1) gives
  ">= 580" for CUDA 13.x under minor version compatibility. SGLang 0.5.23's wheels are built for CUDA 13.
- the installer: NVIDIA/nvidia-installer 590.48.01, option_table.h (`--silent` implies `--ui=none --no-questions`;
  `--dkms`; `--allow-installation-with-running-driver`; `--skip-module-unload` is "ignored when the driver is being
  installed"), kernel.c (a loaded NVIDIA module that rmmod cannot take out aborts a `--no-questions` install unless
  `--allow-installation-with-running-driver`), misc.c dkms_register_module/dkms_module_installed (`dkms ldtarball`,
  `dkms install`, then `dkms status -m nvidia -v <ver> -k <kernel>` must say ": installed").
- the installer's log: NVIDIA/nvidia-installer 590.48.01 nvidia-installer.h DEFAULT_LOG_FILE_NAME
  (/var/log/nvidia-installer.log; option_table.h `--log-file-name`), user-interface.c message_helper/level_str (each
  error is logged as a line starting `ERROR: `), install-from-cwd.c (a failed install ends with the error
  "Installation has failed.  Please see the file '<log>' ...", which says nothing of why).
- NVIDIA's downloads of its data center drivers: https://us.download.nvidia.com/tesla/<version>/
  NVIDIA-Linux-x86_64-<version>.run (the driver phase's default base URL).
- `dkms status` lines: dkms 3.x `nvidia/580.95.05, 6.8.12-4-pve, x86_64: installed` (and `nvidia/580.95.05: added`
  before a build); dkms 2.x `nvidia, 580.95.05, 6.8.12-4-pve, x86_64: installed`.
"""

from __future__ import annotations

import re

# CUDA 13.0 GA's Linux x86_64 driver (the release notes' table): the oldest driver SGLang 0.5.23's CUDA 13 runs on.
CUDA13_DRIVER_FLOOR = "580.65.06"
FLOOR_REASON = "the CUDA 13 floor SGLang 0.5.23 needs (CUDA 13.0 release notes: Linux x86_64 driver >= 580.65.06)"
_VERSION = re.compile(r"(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_PROC_VERSION = re.compile(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)")
_DKMS_LINE = re.compile(
    r"^(?P<module>[^/,\s]+)[/,]\s*(?P<version>[^,:\s]+)(?:,\s*(?P<kernel>[^,:\s]+),\s*(?P<arch>[^,:\s]+))?"
    r"(?:\s*\([^)]*\))?:\s*(?P<state>\w+)"
)
# PCI class of an NVSwitch: "Bridge: other bridge device" (0680), vendor NVIDIA (10de), as `lspci -n` prints it
# (Fabric Manager user guide, "NVSwitch-based systems": the NVSwitches show as NVIDIA bridges beside the GPUs).
_NVSWITCH = re.compile(r"\s0680:\s*10de:[0-9a-f]{4}", re.IGNORECASE)
# NVIDIA's modules that hold the driver loaded, most dependent first (the order `modprobe -r` needs).
MODULES_TO_UNLOAD = ("nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem", "nvidia")
INSTALLER_LOG = "/var/log/nvidia-installer.log"
_ERROR, _INSTALL_FAILED = "ERROR: ", "Installation has failed."
DOWNLOAD_URL = "https://us.download.nvidia.com/tesla/{version}/NVIDIA-Linux-x86_64-{version}.run"


def pinned(version) -> bool:
    """Whether the inventory pins the node's driver: an unset or empty nvidia_driver_version leaves the driver
    unmanaged (the driver phase skips the node, verify does not check it)."""
    return version is not None and version != ""


def pin_problem(version) -> str | None:
    """Why `version` cannot be the node's pin, or None: no pin at all is not a problem (the driver is not
    managed), a pin that is set must be a driver version at the CUDA 13 floor or newer."""
    return version_problem(version) if pinned(version) else None


def download_url(version: str) -> str:
    """NVIDIA's URL of the .run installer for `version`: the default source of the node's driver and, while the
    node runs its pin, of the container's userspace (the same file, so the same sha256)."""
    return DOWNLOAD_URL.format(version=version)


def version_key(version: str) -> tuple[int, ...] | None:
    """(580, 95, 5) for "580.95.05"; None for anything that is not an NVIDIA driver version."""
    m = _VERSION.fullmatch(str(version or ""))
    return tuple(int(p) for p in m.groups() if p is not None) if m else None


def version_problem(version) -> str | None:
    """Why `version` cannot be the node's pinned driver, or None."""
    if not isinstance(version, str) or version_key(version) is None:
        return f"expected an NVIDIA driver version such as 580.95.05, got {version!r}"
    if version_key(version) < version_key(CUDA13_DRIVER_FLOOR):
        return f"{version} is older than {CUDA13_DRIVER_FLOOR}, {FLOOR_REASON}"
    return None


def sha256_problem(value) -> str | None:
    if isinstance(value, str) and _SHA256.fullmatch(value):
        return None
    return "expected the installer's sha256, 64 hex digits (`sha256sum` of the file NVIDIA publishes)"


def source_problem(value) -> str | None:
    """The installer comes from an http(s) URL or an absolute path on the node (an offline site's mirror)."""
    if isinstance(value, str) and (re.match(r"^https?://\S+$", value) or value.startswith("/")) and "\n" not in value:
        return None
    return f"expected an http(s) URL or an absolute path on the node, got {value!r}"


def module_version(proc_text: str | None) -> str | None:
    """The loaded module's version from /proc/driver/nvidia/version, or None."""
    m = _PROC_VERSION.search(proc_text or "")
    return m.group(1) if m else None


def parse_dkms_status(text: str, module: str = "nvidia") -> list[dict]:
    """`dkms status` output (2.x or 3.x) as [{version, kernel, arch, state}] for `module`."""
    found = []
    for line in (text or "").splitlines():
        m = _DKMS_LINE.match(line.strip())
        if m and m.group("module") == module:
            found.append({k: m.group(k) for k in ("version", "kernel", "arch", "state")})
    return found


def dkms_installed(entries: list[dict], version: str, kernel: str) -> bool:
    """DKMS holds `version` installed for `kernel`: what nvidia-installer itself checks after registering."""
    return any(e["version"] == version and e["kernel"] == kernel and e["state"] == "installed" for e in entries)


def installed_version(modinfo_version: str | None, entries: list[dict], kernel: str) -> str | None:
    """The installed module's version for `kernel`: modinfo's (the module file itself); where modinfo cannot read one
    (no file it knows as nvidia), the newest version DKMS has installed for that kernel."""
    if modinfo_version:
        return modinfo_version
    versions = [e["version"] for e in entries if e["kernel"] == kernel and e["state"] == "installed"]
    return max(versions, key=lambda v: version_key(v) or (0,)) if versions else None


def nvswitch_present(lspci_n: str) -> bool:
    """Whether `lspci -n` shows an NVIDIA NVSwitch (an NVIDIA device of class 0680)."""
    return bool(_NVSWITCH.search(lspci_n or ""))


# Secure Boot, as the firmware says it (UEFI's EFI_GLOBAL_VARIABLE SecureBoot: efivarfs gives 4 bytes of attributes,
# then one byte, 1 when on)
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
# the certificate DKMS signs the modules it builds with, unless /etc/dkms/framework.conf says mok_certificate; DKMS
# makes it and its key at its first build (dell/dkms README, "Module signing")
DKMS_FRAMEWORK = "/etc/dkms/framework.conf"
DKMS_CERTIFICATE = "/var/lib/dkms/mok.pub"
_MOK_CERTIFICATE = re.compile(r"""^\s*mok_certificate=["']?([^"'\s#]+)""", re.M)
_SIGNING_KEY_ARG = "--module-signing-public-key="


def secure_boot_on(raw: bytes | None) -> bool:
    """Whether the firmware booted with Secure Boot on, from the SecureBoot variable's bytes (None: no such
    variable, as on a BIOS boot)."""
    return raw is not None and len(raw) >= 5 and raw[4] == 1


def signing_certificate(framework_conf: str | None, args: list[str]) -> str:
    """The certificate the NVIDIA module is signed with: the installer's --module-signing-public-key, else DKMS's."""
    given = next((a[len(_SIGNING_KEY_ARG) :] for a in args if a.startswith(_SIGNING_KEY_ARG)), None)
    found = _MOK_CERTIFICATE.findall(framework_conf or "")
    return given or (found[-1] if found else DKMS_CERTIFICATE)


def secure_boot_problem(on: bool, certificate: str, exists: bool, test_key: str | None) -> str | None:
    """Why a module signed with `certificate` would be refused at load, or None: with Secure Boot on, the kernel loads
    only modules signed by a key in its keyrings, which for a key of the node's own is an enrolled MOK.
    `test_key` is what `mokutil --test-key <certificate>` printed ("... is already enrolled"), None without mokutil."""
    if not on:
        return None
    if not exists:
        why = "DKMS makes it, and its key, at its first build"
        return f"Secure Boot is on, and {certificate} does not exist yet ({why})"
    if test_key is None:
        return f"Secure Boot is on, and mokutil is not installed to tell whether {certificate} is enrolled"
    if "is already enrolled" in test_key:
        return None
    return f"Secure Boot is on, and {certificate} is not an enrolled MOK"


def secure_boot_remedy(certificate: str, exists: bool) -> str:
    """What makes the module load under Secure Boot: the certificate enrolled as a MOK (made first, with its key, where
    it does not exist yet)."""
    enrol = f"enrol it (mokutil --import {certificate}, then confirm in MokManager at the node's console as it reboots)"
    if exists:
        return enrol
    return f"make it and its key first (openssl, as dkms's README shows under Module signing), then {enrol}"


def installer_args(base: list[str], running_driver_stays: bool) -> list[str]:
    """The installer's arguments: `base` (the inventory's), plus the flag without which a silent install aborts
    while an NVIDIA module that could not be unloaded is still loaded (then a reboot loads the new one)."""
    extra = ["--allow-installation-with-running-driver"] if running_driver_stays else []
    return [*base, *[a for a in extra if a not in base]]


def decide(wanted: str, report: dict) -> dict:
    """What the node needs, from what it reports:
    report = {kernel, loaded (the module's version in /proc/driver/nvidia/version, or None), installed (modinfo's
    version of the module for the running kernel, or None), dkms ([{version, kernel, arch, state}]),
    nouveau_loaded (bool)}.
    Returns {managed, install, upgrade, load, unload, may_reboot, reboot_for_nouveau, current, reason}:
    - managed: the inventory pins a driver (else every other key is false, current true: nothing to do);
    - install: the installer must run (nothing installed, another version, or not registered with DKMS);
    - upgrade: another version is installed or loaded;
    - load: the wanted module is installed but not the one loaded (none, or an older one still in memory);
    - unload: a module is loaded and the node is not current: its holders are stopped and it is unloaded first;
    - may_reboot: the loaded module is another version: where a process holds it, it cannot be unloaded and only a
      reboot loads the wanted one (so whether the node may reboot is settled before anything is stopped);
    - reboot_for_nouveau: nouveau is loaded, so the node reboots (after the blacklist) before the installer runs,
      which refuses to install while nouveau is in use;
    - current: nothing to do for the running kernel;
    - build_next: the node boots another kernel next (report's next_kernel) and DKMS has not installed the wanted
      module for it (its headers were missing when it was installed): without it the node reboots without a GPU
      driver."""
    if not pinned(wanted):
        return _unmanaged(report)
    kernel = report.get("kernel", "")
    registered = dkms_installed(report.get("dkms") or [], wanted, kernel)
    installed_ok = report.get("installed") == wanted and registered
    loaded = report.get("loaded")
    install = not installed_ok
    upgrade = any(v not in (None, wanted) for v in (report.get("installed"), loaded))
    load = not install and loaded != wanted
    reboot_for_nouveau = bool(report.get("nouveau_loaded")) and loaded is None
    current = installed_ok and loaded == wanted
    reason = _reason(wanted, report, registered)
    following = report.get("next_kernel") or kernel
    build_next = following != kernel and not dkms_installed(report.get("dkms") or [], wanted, following)
    if build_next:
        reason += f"; the kernel the node boots next, {following}, has no module: build it with DKMS"
    return {
        "managed": True,
        "install": install,
        "upgrade": upgrade,
        "load": load,
        "unload": loaded is not None and not current,
        "may_reboot": loaded not in (None, wanted),
        "reboot_for_nouveau": reboot_for_nouveau,
        "current": current,
        "build_next": build_next,
        "reason": reason,
    }


def _unmanaged(report: dict) -> dict:
    loaded = report.get("loaded")
    running = f"NVIDIA module {loaded} loaded" if loaded else "no NVIDIA module loaded"
    reason = f"driver not managed (nvidia_driver_version is not set), skipped: {running}"
    nothing = ("managed", "install", "upgrade", "load", "unload", "may_reboot", "reboot_for_nouveau", "build_next")
    return {**dict.fromkeys(nothing, False), "current": True, "reason": reason}


def _reason(wanted: str, report: dict, registered: bool) -> str:
    installed, loaded = report.get("installed"), report.get("loaded")
    if installed is None:
        return f"no NVIDIA kernel module installed for kernel {report.get('kernel')}: install {wanted}"
    if installed != wanted:
        return f"driver {installed} installed: upgrade to {wanted}"
    if not registered:
        return f"driver {wanted} installed but not registered with DKMS for {report.get('kernel')}: install again"
    if loaded is None:
        return f"driver {wanted} installed, not loaded: load it"
    if loaded != wanted:
        return f"driver {wanted} installed, {loaded} still loaded: reboot to load {wanted}"
    return f"driver {wanted} installed, registered with DKMS and loaded"


def after_install(wanted: str, loaded: str | None) -> dict:
    """Once the installer ran (or the module was loaded): {reboot, reason}. A module of another version still
    loaded (it could not be unloaded) is replaced only by a reboot."""
    if loaded == wanted:
        return {"reboot": False, "reason": f"driver {wanted} loaded"}
    if loaded is None:
        return {"reboot": False, "reason": f"driver {wanted} installed but not loaded"}
    return {"reboot": True, "reason": f"driver {loaded} still loaded after installing {wanted}: reboot to load it"}


def installer_log(args: list[str]) -> str:
    """Where the installer writes its log: `--log-file-name` among its arguments, else NVIDIA's default."""
    for i, arg in enumerate(args):
        if arg.startswith("--log-file-name="):
            return arg.split("=", 1)[1]
        if arg == "--log-file-name" and i + 1 < len(args):
            return args[i + 1]
    return INSTALLER_LOG


def last_installer_error(log_text: str | None) -> str | None:
    """The last error the installer logged that says why it failed (its closing "Installation has failed." says
    only that it did), with the indented lines a wrapped message goes on over; None where the log holds none."""
    errors: list[str] = []
    going_on = False  # the line before was an error's
    for line in (log_text or "").splitlines():
        if line.startswith(_ERROR):
            errors.append(line[len(_ERROR) :].strip())
        elif going_on and line[:1].isspace() and line.strip():
            errors[-1] += " " + line.strip()
        going_on = line.startswith(_ERROR) or (going_on and line[:1].isspace() and bool(line.strip()))
    said = [e for e in errors if e and not e.startswith(_INSTALL_FAILED)]
    return said[-1] if said else None


def last_output_line(output: str | None) -> str | None:
    """The last line the .run printed: where it failed before nvidia-installer wrote a log (the self-extractor's
    checksum, a /tmp that is full or noexec, an unknown option), the only words about why."""
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    return lines[-1] if lines else None


def installer_failure(host: str, version: str, rc: int, log_path: str, log_text: str | None, output: str = "") -> str:
    """The one line for a failed install: the host, the version, the log, and the installer's last error (from its
    log, else the last line it printed)."""
    error = last_installer_error(log_text) or last_output_line(output)
    why = f": {error}" if error else ""
    return f"{host}: the NVIDIA installer for driver {version} failed (exit {rc}){why}; its log: {host}:{log_path}"
