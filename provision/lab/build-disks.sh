#!/bin/bash
# Builds the lab's two bootable disks from the cached rootfs, without loop devices:
#   build-disks.sh ROOTFS OVERLAY_DIR OUT_DIR ROOT_UUID ESP_VOLID
#   OUT_DIR/grub.raw    BIOS + GRUB: the kernel command line comes from /etc/default/grub
#   OUT_DIR/sdboot.raw  UEFI + systemd-boot: the kernel command line comes from
#                       /etc/kernel/cmdline, written to the ESP by proxmox-boot-tool refresh
# The rootfs is not modified: each disk's view is an overlayfs (lab files + rootfs) in a
# private mount namespace, and mkfs.ext4 -d fills the filesystem from that view.
set -euo pipefail
ROOTFS=$1 OVERLAY=$2 OUT=$3 ROOT_UUID=$4 ESP_VOLID=$5
ESP_UUID="${ESP_VOLID:0:4}-${ESP_VOLID:4:4}"
SIZE_MB=4096
mkdir -p "$OUT"
WORK=$(mktemp -d "$OUT/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

prepare_view() {  # $1 variant: mount the merged view at $WORK/$1/root and customise it
  local v=$1 M=$WORK/$1/root
  mkdir -p "$WORK/$v/upper" "$WORK/$v/work" "$M"
  mount -t overlay overlay -o "lowerdir=$OVERLAY/common:$ROOTFS,upperdir=$WORK/$v/upper,workdir=$WORK/$v/work" "$M"
  chmod 0755 "$M"/usr/local/lib/lab/*.sh "$M"/usr/local/lib/lab/pve-guests "$M"/usr/local/bin/nvidia-smi "$M"/usr/bin/nvidia-modprobe "$M"/usr/local/sbin/proxmox-boot-tool "$M"/usr/local/sbin/dkms "$M"/etc/kernel/*/dkms
  echo "UUID=$ROOT_UUID / ext4 errors=remount-ro 0 1" > "$M/etc/fstab"
  echo "lab-$v" > "$M/etc/hostname"
  : > "$M/etc/machine-id"
  chroot "$M" systemctl enable lab-identity.service lab-ops-user.service lab-fake-nvidia.service pve-guests.service >/dev/null 2>&1
}

fill_ext4() {  # $1 image, $2 byte offset, $3 size in MiB, $4 source dir
  mkfs.ext4 -q -F -U "$ROOT_UUID" -L root -d "$4" -E offset="$2" "$1" "$3M"
}

grub_disk() {
  local M=$WORK/grub/root IMG=$OUT/grub.raw.tmp
  sed -i -e 's/^GRUB_TIMEOUT=.*/GRUB_TIMEOUT=1/' \
         -e 's/^GRUB_CMDLINE_LINUX=.*/GRUB_CMDLINE_LINUX="console=ttyS0,115200n8"/' "$M/etc/default/grub"
  grep -q '^GRUB_TERMINAL=' "$M/etc/default/grub" || \
    printf 'GRUB_TERMINAL="console serial"\nGRUB_SERIAL_COMMAND="serial --speed=115200"\n' >> "$M/etc/default/grub"
  mkdir -p "$M/boot/grub/i386-pc"
  cp "$M"/usr/lib/grub/i386-pc/*.mod "$M"/usr/lib/grub/i386-pc/*.lst "$M/boot/grub/i386-pc/"
  chroot "$M" grub-editenv /boot/grub/grubenv create
  # update-grub with grub-probe answered for "/ is ext4 on /dev/vda1" and a fake by-uuid link
  cat > "$WORK/grub-probe" <<PROBE
#!/bin/sh
t=; while [ \$# -gt 0 ]; do case "\$1" in --target=*) t=\${1#--target=};; -t) shift; t=\$1;; esac; shift; done
case "\$t" in device) echo /dev/vda1;; fs) echo ext2;; fs_uuid) echo $ROOT_UUID;; fs_label) echo root;;
  partmap) echo msdos;; abstraction) echo;; drive) echo '(hd0,msdos1)';; compatibility_hint) echo hd0,msdos1;;
  hints_string) echo '--hint-bios=hd0,msdos1 --hint-efi=hd0,msdos1 --hint-baremetal=ahci0,msdos1';; *) exit 1;; esac
PROBE
  chmod +x "$WORK/grub-probe"
  mount -t tmpfs none "$M/dev"; touch "$M/dev/null" "$M/dev/vda1"; mount --bind /dev/null "$M/dev/null"
  mkdir -p "$M/dev/disk/by-uuid"; ln -s ../../vda1 "$M/dev/disk/by-uuid/$ROOT_UUID"
  mount --bind "$WORK/grub-probe" "$M/usr/sbin/grub-probe"; mount -t proc proc "$M/proc"
  chroot "$M" update-grub 2>/dev/null
  umount "$M/proc" "$M/usr/sbin/grub-probe" "$M/dev/null" "$M/dev"
  printf "search.fs_uuid %s root hd0,msdos1\nset prefix=(\$root)'/boot/grub'\n" "$ROOT_UUID" > "$M/tmp/load.cfg"
  chroot "$M" grub-mkimage -O i386-pc -c /tmp/load.cfg -o /tmp/core.img -p /boot/grub \
    biosdisk part_msdos ext2 search_fs_uuid
  mv "$M/tmp/core.img" "$WORK/core.img"; rm -f "$M/tmp/load.cfg"
  rm -f "$IMG"; truncate -s "${SIZE_MB}M" "$IMG"
  printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$IMG"
  fill_ext4 "$IMG" 1048576 $((SIZE_MB - 1)) "$M"
  dd if="$M/usr/lib/grub/i386-pc/boot.img" of="$IMG" bs=440 count=1 conv=notrunc status=none
  dd if="$WORK/core.img" of="$IMG" bs=512 seek=1 conv=notrunc status=none
  mv "$IMG" "$OUT/grub.raw"
}

sdboot_disk() {
  local M=$WORK/sdboot/root IMG=$OUT/sdboot.raw.tmp ESP_MB=256 ESP_IMG=$WORK/esp.img
  echo "root=UUID=$ROOT_UUID ro console=ttyS0,115200n8 quiet" > "$M/etc/kernel/cmdline"
  echo "$ESP_UUID" > "$M/etc/kernel/proxmox-boot-uuids"
  mkdir -p "$M/tmp/esp/EFI/BOOT" "$M/tmp/esp/EFI/systemd"
  cp "$M/usr/lib/systemd/boot/efi/systemd-bootx64.efi" "$M/tmp/esp/EFI/BOOT/BOOTX64.EFI"
  cp "$M/usr/lib/systemd/boot/efi/systemd-bootx64.efi" "$M/tmp/esp/EFI/systemd/systemd-bootx64.efi"
  chroot "$M" /usr/local/sbin/proxmox-boot-tool --esp-dir /tmp/esp refresh >/dev/null
  rm -f "$ESP_IMG"
  mkfs.vfat -F 32 -n ESP -i "$ESP_VOLID" -C "$ESP_IMG" $((ESP_MB * 1024)) >/dev/null
  mcopy -s -i "$ESP_IMG" "$M"/tmp/esp/* ::/
  rm -rf "$M/tmp/esp"
  rm -f "$IMG"; truncate -s "${SIZE_MB}M" "$IMG"
  printf 'label: gpt\nstart=2048, size=%s, type=uefi\nstart=%s, type=linux\n' \
    $((ESP_MB * 2048)) $(((ESP_MB + 1) * 2048)) | sfdisk -q "$IMG"
  dd if="$ESP_IMG" of="$IMG" bs=1M seek=1 conv=notrunc status=none
  fill_ext4 "$IMG" $(((ESP_MB + 1) * 1048576)) $((SIZE_MB - ESP_MB - 2)) "$M"
  mv "$IMG" "$OUT/sdboot.raw"
}

export -f prepare_view fill_ext4 grub_disk sdboot_disk
export ROOTFS OVERLAY OUT ROOT_UUID ESP_VOLID ESP_UUID SIZE_MB WORK
unshare -m --propagation private bash -euo pipefail -c '
  prepare_view grub;   grub_disk
  prepare_view sdboot; sdboot_disk
'
