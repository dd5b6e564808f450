#!/usr/bin/env bash
# Run a command inside a Debian-kernel VM (issue 21).
#
#   bash scripts/vm.sh --kernel 5.10|6.1|6.12 [--userspace bullseye|bookworm|trixie]
#                      [--mem MiB] [--cpus N] [--timeout SECS] -- COMMAND...
#
# Boots Debian's kernel of that version (5.10 = bullseye, 6.1 = bookworm, 6.12 = trixie) under
# qemu-system-x86_64 in software emulation (TCG: /dev/kvm exists on our machines but KVM guests
# hang at boot), runs COMMAND in the caller's working directory and exits with its status;
# COMMAND's stdout and stderr go to the caller's stdout and stderr.
#
# The guest sees the host's file system at the same paths: the host's / is exported read-only
# over virtio-9p and becomes the lower layer of an overlayfs whose upper layer is a tmpfs (the
# guest can change anything, the host is never touched), the project's directory (the git
# top-level of this script) is exported again writable and mounted at the same path (cargo
# writes target/); /run (so /var/run/netns) and /dev/shm are tmpfs; /tmp is the overlay's, so
# the host's files there are visible and what the guest writes stays in the guest's memory.
# Boot under TCG: about 7-10 s to COMMAND on a loaded 2-core machine (the uncompressed kernel is
# booted through its PVH entry to skip decompression; every mount is done by busybox from RAM).
# Cargo inside the guest works (`-- cargo test --locked --test X` finds the host's build fresh)
# but do not run it while a cargo on the host builds the same target/: file locks are not shared
# over 9p, so the two would not wait for each other. scripts/kernel-matrix.sh therefore runs
# the test binaries the host built, directly. The kernel package's modules are
# mounted at /lib/modules/<version> and loaded on demand (kernel.modprobe is the host's
# /sbin/modprobe), nothing is loaded eagerly except what the boot itself needs (9p, overlay,
# virtio console), which a tiny initramfs (static busybox + those modules, scripts/vm-init.sh
# as /init) loads. Environment passed through: PATH, HOME, USER, LANG, TERM, CARGO_HOME,
# RUSTUP_HOME, RUSTUP_TOOLCHAIN, RUST_BACKTRACE, RUST_LOG, CARGO_TARGET_DIR and every NETPOL_*,
# NPA_*, FELIX_* variable.
#
# --userspace RELEASE: that Debian release's netfilter userspace (iptables, ip6tables, *-save,
# *-restore, -legacy and -nft variants, ebtables/arptables, ipset, iproute2's ip/tc/bridge/ss,
# conntrack, nft, ipvsadm) replaces the host's inside the guest. The release's root file system
# is made once with debootstrap (target/vm/rootfs-RELEASE). Approach: our test binaries are
# linked against the host's glibc and must run on the host's root, so COMMAND keeps the host's
# root and only the tools are swapped: in the guest's (tmpfs-backed) overlay each tool's path
# (/usr/sbin/iptables, /usr/bin/ip, ...) is replaced by a two-line wrapper that runs the
# release's binary with the release's own dynamic loader and libraries
# (<root>/lib64/ld-linux-x86-64.so.2 --library-path <root's lib dirs> <argv0 link> "$@") and
# XTABLES_LIBDIR pointing at the release's iptables extensions. xtables-*-multi dispatch on
# basename(argv[0]); bullseye's ld.so (glibc 2.31) has no --argv0, so argv[0] is a symlink named
# like the tool (target/vm/rootfs-RELEASE/.npa-argv0/iptables-legacy -> xtables-legacy-multi).
# Replacing the files themselves (not only PATH) also catches callers that use absolute paths.
# A bind mount of the release's /usr/sbin would not work: trixie's tools need glibc 2.41, the
# host has 2.36. Without --userspace the guest uses the host's own tools.
#
# Caches (target/vm/): apt state for the three releases (its own sources list pointing at the
# Debian mirror the host already uses; the host's apt configuration is not changed), the
# extracted kernel packages (depmod'ed), the initramfs per kernel, the debootstrapped roots.
# A second run downloads nothing. Per run: target/vm/run-<pid>/ (console.log: the guest's
# kernel console; removed on success unless NPA_VM_KEEP=1).
#
# Installs (as root, apt) what is missing: qemu-system-x86, busybox-static, cpio, kmod,
# debootstrap (only for --userspace). A guest that does not finish within --timeout seconds
# (default 3600) is killed (status 124); a kernel panic powers the guest off (panic=-1,
# -no-reboot) and is reported (status 125, the console's last lines on stderr).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proj="$(cd "$here/.." && pwd)"
vmdir="$proj/target/vm"

kernel=""
userspace=""
mem=4096
cpus=2
timeout_s=3600
usage() {
	echo "usage: bash scripts/vm.sh --kernel 5.10|6.1|6.12 [--userspace bullseye|bookworm|trixie] [--mem MiB] [--cpus N] [--timeout SECS] -- COMMAND..." >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case "$1" in
	--kernel) kernel="${2:-}"; shift 2 ;;
	--userspace) userspace="${2:-}"; shift 2 ;;
	--mem) mem="${2:-}"; shift 2 ;;
	--cpus) cpus="${2:-}"; shift 2 ;;
	--timeout) timeout_s="${2:-}"; shift 2 ;;
	--) shift; break ;;
	-h | --help) usage ;;
	*) echo "vm.sh: unknown argument $1" >&2; usage ;;
	esac
done
[ $# -gt 0 ] || usage
case "$kernel" in
5.10) krel=bullseye ;;
6.1) krel=bookworm ;;
6.12) krel=trixie ;;
*) echo "vm.sh: --kernel must be 5.10, 6.1 or 6.12" >&2; usage ;;
esac
case "$userspace" in
"" | host) userspace="" ;;
bullseye | bookworm | trixie) ;;
*) echo "vm.sh: --userspace must be bullseye, bookworm or trixie" >&2; usage ;;
esac

log() { [ -n "${NPA_VM_QUIET:-}" ] || echo "vm.sh: $*" >&2; }
die() { echo "vm.sh: $*" >&2; exit 125; }

# --- what the host needs ---------------------------------------------------------------
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need_pkgs+=(busybox-static)
command -v cpio >/dev/null || need_pkgs+=(cpio)
command -v depmod >/dev/null || need_pkgs+=(kmod)
command -v xz >/dev/null || need_pkgs+=(xz-utils)
command -v zstd >/dev/null || need_pkgs+=(zstd)
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need_pkgs+=(debian-archive-keyring)
if [ -n "$userspace" ]; then command -v debootstrap >/dev/null || need_pkgs+=(debootstrap); fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
	log "installing ${need_pkgs[*]}"
	[ "$(id -u)" = 0 ] || die "need root to install ${need_pkgs[*]}"
	apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null 2>&1 || true
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
		--no-install-recommends "${need_pkgs[@]}" >/dev/null || die "apt-get install ${need_pkgs[*]} failed"
fi

case "$proj$PWD" in *[[:space:]]*) die "the project's path and the working directory must not contain spaces" ;; esac
mkdir -p "$vmdir"

# The Debian mirror the host already uses (first non-security deb.debian.org-style URI).
mirror() {
	local m
	m="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
		sed -n -e 's/^URIs:[[:space:]]*//p' -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' |
		grep -v -e security -e '^#' | grep -m1 '/debian/\?$' || true)"
	echo "${m:-http://deb.debian.org/debian}"
}

# apt with a private state dir for one release (the host's apt configuration is untouched).
apt_rel() {
	local rel="$1"; shift
	local d="$vmdir/apt/$rel"
	mkdir -p "$d/state/lists/partial" "$d/cache/archives/partial" "$d/etc/preferences.d" "$d/etc/apt.conf.d"
	if [ ! -s "$d/sources.list" ]; then
		echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(mirror) $rel main" >"$d/sources.list"
	fi
	local tool=apt-get
	if [ "$1" = cache ]; then tool=apt-cache; shift; fi
	"$tool" -o DPkg::Lock::Timeout=600 -o Dir::Etc::sourcelist="$d/sources.list" -o Dir::Etc::sourceparts=- \
		-o Dir::Etc::preferencesparts="$d/etc/preferences.d" -o Dir::Etc::parts="$d/etc/apt.conf.d" \
		-o Dir::State="$d/state" -o Dir::Cache="$d/cache" -o APT::Architecture=amd64 \
		-o Debug::NoLocking=1 -o APT::Get::List-Cleanup=0 -o APT::Sandbox::User=root "$@"
}

# --- the kernel --------------------------------------------------------------------------
kdir="$vmdir/kernel-$krel"
if [ ! -e "$kdir/.done" ]; then
	(
		flock 8
		[ -e "$kdir/.done" ] && exit 0
		log "fetching Debian $krel's kernel (once)"
		rm -rf "$kdir" "$kdir.tmp"
		mkdir -p "$kdir.tmp/deb"
		apt_rel "$krel" update -qq >/dev/null || { echo "vm.sh: apt-get update for $krel failed" >&2; exit 1; }
		pkg="$(apt_rel "$krel" cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\).*/\1/p' | head -1)"
		[ -n "$pkg" ] || { echo "vm.sh: no linux-image package found for $krel" >&2; exit 1; }
		(cd "$kdir.tmp/deb" && apt_rel "$krel" download -qq "$pkg" >/dev/null) || { echo "vm.sh: download of $pkg failed" >&2; exit 1; }
		dpkg-deb -x "$kdir.tmp/deb/"*.deb "$kdir.tmp/root"
		mods="$kdir.tmp/root/lib/modules"
		[ -d "$mods" ] || mods="$kdir.tmp/root/usr/lib/modules"
		ver="$(ls "$mods")"
		mkdir -p "$kdir.tmp/modules"
		mv "$mods/$ver" "$kdir.tmp/modules/$ver"
		depmod -b "$kdir.tmp" "$ver" 2>/dev/null || {
			# depmod looks in <base>/lib/modules: make that layout.
			mkdir -p "$kdir.tmp/lib"; ln -s ../modules "$kdir.tmp/lib/modules"; depmod -b "$kdir.tmp" "$ver"
		}
		cp "$kdir.tmp/root/boot/vmlinuz-$ver" "$kdir.tmp/vmlinuz"
		cp "$kdir.tmp/root/boot/config-$ver" "$kdir.tmp/config"
		# The uncompressed ELF kernel boots directly (PVH entry), skipping the decompression
		# that takes seconds under TCG; the bzImage stays the fallback.
		for magic in $'\xfd7zXZ\x00' $'\x28\xb5\x2f\xfd'; do
			off="$(LC_ALL=C grep -abo "$magic" "$kdir.tmp/vmlinuz" | head -1 | cut -d: -f1 || true)"
			[ -n "$off" ] || continue
			case "$magic" in
			*XZ*) tail -c +$((off + 1)) "$kdir.tmp/vmlinuz" | xz -dc --single-stream >"$kdir.tmp/vmlinux" 2>/dev/null || true ;;
			*) tail -c +$((off + 1)) "$kdir.tmp/vmlinuz" | zstd -qdc >"$kdir.tmp/vmlinux" 2>/dev/null || true ;;
			esac
			if grep -q '^CONFIG_PVH=y' "$kdir.tmp/config" && [ "$(head -c 4 "$kdir.tmp/vmlinux" 2>/dev/null)" = $'\x7fELF' ]; then
				break
			fi
			rm -f "$kdir.tmp/vmlinux"
		done
		echo "$ver" >"$kdir.tmp/version"
		echo "$pkg" >"$kdir.tmp/package"
		rm -rf "$kdir.tmp/root" "$kdir.tmp/deb"
		touch "$kdir.tmp/.done"
		mv "$kdir.tmp" "$kdir"
	) 8>"$vmdir/.lock-kernel-$krel" || exit 125
fi
kver="$(cat "$kdir/version")"
kimage="$kdir/vmlinuz"
[ -s "$kdir/vmlinux" ] && kimage="$kdir/vmlinux"
moddir="$kdir/modules/$kver"

# --- the initramfs: static busybox, the boot's modules, scripts/vm-init.sh as /init --------
initrd="$kdir/initrd.cpio"
if [ ! -e "$initrd" ] || [ "$here/vm-init.sh" -nt "$initrd" ]; then
	(
		flock 8
		t="$kdir/initrd.tmp"
		rm -rf "$t"
		mkdir -p "$t/bin" "$t/modules" "$t/dev" "$t/proc" "$t/sys" "$t/mnt"
		cp /bin/busybox "$t/bin/busybox"
		cp "$here/vm-init.sh" "$t/init"
		chmod +x "$t/init"
		# The closure of what the boot needs, dependencies first (modules.dep lists them).
		declare -A seen=()
		order=()
		add() {
			local rel="$1" d
			[ -n "${seen[$rel]:-}" ] && return 0
			seen[$rel]=1
			for d in $(sed -n "s|^$rel: *||p" "$moddir/modules.dep"); do add "$d"; done
			order+=("$rel")
		}
		for m in virtio_pci virtio_console 9pnet_virtio 9p overlay; do
			rel="$(grep -E "(^|/)$m\.ko(\.[a-z]+)?:" "$moddir/modules.dep" | head -1 | cut -d: -f1 || true)"
			[ -n "$rel" ] && add "$rel"   # built in when not listed
		done
		i=0
		for rel in "${order[@]}"; do
			i=$((i + 1))
			out="$t/modules/$(printf %02d "$i")-$(basename "$rel" | sed 's/\.ko.*//').ko"
			case "$rel" in
			*.xz) xz -dc "$moddir/$rel" >"$out" ;;
			*.zst) zstd -qdc "$moddir/$rel" >"$out" ;;
			*.gz) gzip -dc "$moddir/$rel" >"$out" ;;
			*) cp "$moddir/$rel" "$out" ;;
			esac
		done
		(cd "$t" && find . | cpio -o -H newc --quiet) >"$initrd.new"
		mv "$initrd.new" "$initrd"
		rm -rf "$t"
	) 8>"$vmdir/.lock-kernel-$krel"
fi

# --- the release's userspace ----------------------------------------------------------------
tools="iptables iptables-save iptables-restore iptables-legacy iptables-legacy-save iptables-legacy-restore
iptables-nft iptables-nft-save iptables-nft-restore ip6tables ip6tables-save ip6tables-restore
ip6tables-legacy ip6tables-legacy-save ip6tables-legacy-restore ip6tables-nft ip6tables-nft-save
ip6tables-nft-restore iptables-xml xtables-legacy-multi xtables-nft-multi xtables-monitor
ebtables ebtables-nft ebtables-save ebtables-restore arptables arptables-nft
ipset ip tc bridge ss conntrack nft ipvsadm ipvsadm-save ipvsadm-restore"
usroot=""
if [ -n "$userspace" ]; then
	usroot="$vmdir/rootfs-$userspace"
	if [ ! -e "$usroot/.npa-done" ]; then
		(
			flock 8
			[ -e "$usroot/.npa-done" ] && exit 0
			log "debootstrapping Debian $userspace's userspace into $usroot (once)"
			rm -rf "$usroot"
			debootstrap --variant=minbase --include=iptables,ipset,iproute2,conntrack,kmod,nftables,procps,ipvsadm,arptables,ebtables \
				--keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
				"$userspace" "$usroot" "$(mirror)" >"$vmdir/debootstrap-$userspace.log" 2>&1 ||
				{ echo "vm.sh: debootstrap $userspace failed, see $vmdir/debootstrap-$userspace.log" >&2; exit 1; }
			# Where each tool is in that release (following its alternatives).
			mkdir -p "$usroot/.npa-argv0"
			: >"$usroot/.npa-tools"
			for n in $tools; do
				p="$(chroot "$usroot" /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin sh -c "p=\$(command -v $n) && readlink -f \"\$p\"" 2>/dev/null || true)"
				[ -n "$p" ] || continue
				ln -sfn "$usroot$p" "$usroot/.npa-argv0/$n"
				echo "$n" >>"$usroot/.npa-tools"
			done
			touch "$usroot/.npa-done"
		) 8>"$vmdir/.lock-rootfs-$userspace" || exit 125
	fi
	# The release's dynamic loader, its symlinks resolved inside that root (they are absolute).
	if [ ! -s "$usroot/.npa-ldso" ]; then
		chroot "$usroot" /usr/bin/readlink -f /lib64/ld-linux-x86-64.so.2 >"$usroot/.npa-ldso.new" &&
			mv "$usroot/.npa-ldso.new" "$usroot/.npa-ldso" || die "cannot find $userspace's dynamic loader"
	fi
fi

# --- this run ---------------------------------------------------------------------------------
run="$vmdir/run-$$"
rm -rf "$run"
mkdir -p "$run"
cleanup() {
	[ -n "${cat_out:-}" ] && kill "$cat_out" 2>/dev/null || true
	[ -n "${cat_err:-}" ] && kill "$cat_err" 2>/dev/null || true
	if [ "${keep:-0}" = 0 ] && [ -z "${NPA_VM_KEEP:-}" ]; then rm -rf "$run"; fi
}
trap cleanup EXIT

{
	echo "# written by scripts/vm.sh"
	echo "NPA_VM_PROJ=$(printf %q "$proj")"
	echo "NPA_VM_RUN=$(printf %q "$run")"
	echo "NPA_VM_KVER=$(printf %q "$kver")"
	echo "NPA_VM_MODDIR=$(printf %q "$moddir")"
	echo "NPA_VM_USROOT=$(printf %q "$usroot")"
	echo "NPA_VM_CWD=$(printf %q "$PWD")"
	echo "NPA_VM_TOOLS=$(printf %q "$tools")"
	printf 'NPA_VM_CMD=('
	printf '%q ' "$@"
	echo ')'
	for v in $(compgen -e); do
		case "$v" in
		PATH | HOME | USER | LANG | LC_ALL | TERM | CARGO_HOME | RUSTUP_HOME | RUSTUP_TOOLCHAIN | RUST_BACKTRACE | RUST_LOG | \
			CARGO_TARGET_DIR | CARGO_TERM_COLOR | NETPOL_* | NPA_* | FELIX_*)
			case "$v" in NPA_VM_*) continue ;; esac
			echo "export $v=$(printf %q "${!v}")" ;;
		esac
	done
} >"$run/env.sh"

mkfifo "$run/stdout" "$run/stderr"
cat "$run/stdout" &
cat_out=$!
cat "$run/stderr" >&2 &
cat_err=$!

kparams="quiet loglevel=1"
[ -z "${NPA_VM_DEBUG:-}" ] || kparams="loglevel=7 npa_vm_debug=1"
start=$(date +%s.%N)
set +e
timeout --foreground -k 10 "$timeout_s" qemu-system-x86_64 \
	-accel tcg -cpu max -smp "$cpus" -m "$mem" \
	-nographic -no-reboot -nodefaults \
	-kernel "$kimage" -initrd "$initrd" \
	-append "console=ttyS0 $kparams panic=-1 oops=panic rdinit=/init npa_vm_run=$run npa_vm_proj=$proj npa_vm_kver=$kver${usroot:+ npa_vm_usroot=$usroot}" \
	-serial "file:$run/console.log" \
	-device virtio-serial-pci \
	-chardev "file,id=out,path=$run/stdout" -device virtserialport,chardev=out,name=npa.stdout \
	-chardev "file,id=err,path=$run/stderr" -device virtserialport,chardev=err,name=npa.stderr \
	-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
	-virtfs "local,path=$proj,mount_tag=proj,security_model=none,multidevs=remap" \
	-virtfs "local,path=$moddir,mount_tag=modules,security_model=none,readonly=on,multidevs=remap" \
	</dev/null >"$run/qemu.log" 2>&1
qrc=$?
set -e
end=$(date +%s.%N)
wait "$cat_out" 2>/dev/null || true
wait "$cat_err" 2>/dev/null || true
cat_out="" cat_err=""

if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
	keep=1
	echo "vm.sh: the guest did not finish within ${timeout_s}s and was killed (console: $run/console.log)" >&2
	tail -n 20 "$run/console.log" >&2 || true
	exit 124
fi
if [ ! -s "$run/status" ]; then
	keep=1
	if grep -q 'Kernel panic' "$run/console.log" 2>/dev/null; then
		echo "vm.sh: the guest's kernel panicked: $(grep -m1 -o 'Kernel panic.*' "$run/console.log")" >&2
	fi
	echo "vm.sh: the guest stopped without COMMAND's status (qemu exit $qrc; console: $run/console.log, qemu: $run/qemu.log)" >&2
	tail -n 30 "$run/console.log" >&2 || true
	tail -n 5 "$run/qemu.log" >&2 || true
	exit 125
fi
rc="$(cat "$run/status")"
log "kernel $kver${userspace:+, $userspace userspace}: boot $(cat "$run/boot-seconds" 2>/dev/null || echo '?') s, total $(echo "$end - $start" | bc 2>/dev/null || awk "BEGIN{print $end - $start}") s, status $rc"
exit "$rc"
