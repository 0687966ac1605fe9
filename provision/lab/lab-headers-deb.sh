#!/bin/bash
# Builds, next to a kernel package in the lab's apt repository, a package named as Debian names that kernel's headers:
#   lab-headers-deb.sh REPO_DIR
# It holds what DKMS reads of a kernel's headers (dkms.in: /lib/modules/<kernel>/build, and its include/ directory,
# which Debian's dkms kernel hooks test for) and none of the ~20,000 header files: the lab's dkms builds nothing, and
# unpacking them took minutes under TCG. Its maintainer script is Debian's (linux debian/templates/headers.postinst.in):
# it runs /etc/kernel/header_postinst.d with the kernel's release, where dkms's hook builds the node's DKMS modules.
set -euo pipefail
REPO=$1
deb=$(ls "$REPO"/linux-image-[0-9]*_*.deb)
package=$(dpkg-deb -f "$deb" Package)
release=${package#linux-image-}
version=$(dpkg-deb -f "$deb" Version)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/DEBIAN" "$work/usr/src/linux-headers-$release/include" "$work/lib/modules/$release"
ln -s "/usr/src/linux-headers-$release" "$work/lib/modules/$release/build"
printf 'The lab holds no header files: nothing in it compiles a kernel module.\n' \
  > "$work/usr/src/linux-headers-$release/include/README.lab"
cat > "$work/DEBIAN/control" <<CONTROL
Package: linux-headers-$release
Version: $version
Architecture: amd64
Maintainer: provision lab <lab@localhost>
Depends: $package (= $version)
Section: kernel
Priority: optional
Description: Header files for Linux $release (lab: the build link DKMS reads, no header files)
CONTROL
cat > "$work/DEBIAN/postinst" <<POSTINST
#!/bin/sh -e
if [ -d /etc/kernel/header_postinst.d ]; then
  DEB_MAINT_PARAMS="\$*" run-parts --report --exit-on-error --arg=$release /etc/kernel/header_postinst.d
fi
exit 0
POSTINST
chmod 0755 "$work/DEBIAN/postinst"
dpkg-deb --root-owner-group -Zxz -b "$work" "$REPO/linux-headers-${release}_${version}_amd64.deb" >/dev/null
