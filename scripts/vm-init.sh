#!/bin/busybox sh
# The guest's init for scripts/vm.sh (read its header first).
#
# Stage 1 (no arguments; PID 1 in the initramfs; static busybox): load the boot's modules, mount
# the host's / (9p, read-only) under a tmpfs-backed overlay, the project directory (9p, writable)
# and the kernel's modules at their paths inside it, proc/sys/dev/run/cgroup2 in it, bring up
# lo, point kernel.modprobe at the host's modprobe, install the --userspace wrappers, then
# switch_root into it and run this file again with the host's bash. Everything is done here with
# busybox from RAM: every program started from the 9p root costs seconds under TCG.
# Stage 2 ("stage2"; PID 1 on the overlay; bash): the caller's environment, COMMAND in the
# caller's directory with its output on the virtio ports npa.stdout/npa.stderr, its status
# written to <run dir>/status, power off.

if [ "${1:-}" != stage2 ]; then
	/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin
	/bin/busybox --install -s
	export PATH=/sbin:/bin:/usr/sbin:/usr/bin
	mount -t proc proc /proc
	mount -t sysfs sysfs /sys
	mount -t devtmpfs devtmpfs /dev
	cmdline=" $(cat /proc/cmdline) "
	mark() { case "$cmdline" in *" npa_vm_debug=1 "*) echo "vm-init: $(cat /proc/uptime /mnt/root/proc/uptime 2>/dev/null | cut -d' ' -f1) $*" >/dev/console ;; esac; }
	for m in /modules/*.ko; do
		[ -e "$m" ] || continue
		insmod "$m" 2>/dev/null || echo "vm-init: insmod $m failed" >/dev/console
	done
	mark "stage 1: modules loaded"
	run="" proj="" kver="" usroot=""
	for a in $cmdline; do
		case "$a" in
		npa_vm_run=*) run="${a#npa_vm_run=}" ;;
		npa_vm_proj=*) proj="${a#npa_vm_proj=}" ;;
		npa_vm_kver=*) kver="${a#npa_vm_kver=}" ;;
		npa_vm_usroot=*) usroot="${a#npa_vm_usroot=}" ;;
		esac
	done
	fail() {
		echo "vm-init: $*" >/dev/console
		echo o >/proc/sysrq-trigger
		sleep 10
		exit 1
	}
	N=/mnt/root
	mkdir -p /mnt/lower /mnt/rw $N /mnt/proj
	opts="trans=virtio,version=9p2000.L,msize=512000"
	mount -t 9p -o "$opts,ro,cache=loose" hostroot /mnt/lower || fail "mount of the host's / failed"
	mount -t tmpfs -o mode=0755 tmpfs /mnt/rw || fail "tmpfs"
	mkdir -p /mnt/rw/upper /mnt/rw/work
	mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work $N ||
		fail "overlay mount failed"
	mount -t 9p -o "$opts" proj /mnt/proj || fail "mount of the project failed"
	mkdir -p "$N$proj"
	mount --move /mnt/proj "$N$proj" || fail "cannot move the project mount"
	mkdir -p "$N/lib/modules/$kver"
	mount -t 9p -o "$opts,ro,cache=loose" modules "$N/lib/modules/$kver" || fail "mount of the modules failed"
	umount /proc /sys 2>/dev/null
	mount --move /dev $N/dev 2>/dev/null || { umount /dev 2>/dev/null; mount -t devtmpfs devtmpfs $N/dev; }
	mount -t proc proc $N/proc
	mount -t sysfs sysfs $N/sys
	mkdir -p $N/dev/pts $N/dev/shm
	# What udev or systemd gives every real node (devtmpfs has none of them). Without /dev/fd,
	# execveat(fd, "", AT_EMPTY_PATH) fails with ENOENT on 5.10 (fine on 6.x), so runc's init,
	# which re-executes itself that way, died and no containerd sandbox could start.
	ln -sfn /proc/self/fd $N/dev/fd
	ln -sfn /proc/self/fd/0 $N/dev/stdin
	ln -sfn /proc/self/fd/1 $N/dev/stdout
	ln -sfn /proc/self/fd/2 $N/dev/stderr
	mount -t devpts -o newinstance,ptmxmode=0666 devpts $N/dev/pts
	mount -t tmpfs tmpfs $N/dev/shm
	mount -t tmpfs -o mode=0755 tmpfs $N/run
	mkdir -p $N/run/netns $N/run/lock
	mount -t cgroup2 cgroup2 $N/sys/fs/cgroup 2>/dev/null
	mount -t bpf bpf $N/sys/fs/bpf 2>/dev/null
	echo /sbin/modprobe >$N/proc/sys/kernel/modprobe
	echo npa-vm >$N/proc/sys/kernel/hostname
	ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
	# --userspace: replace each of the host's tools by a wrapper that runs the release's binary
	# with the release's loader and libraries (argv[0] through a symlink named like the tool).
	if [ -n "$usroot" ]; then
		R="$usroot"
		ldso="$R$(cat "$N$R/.npa-ldso")"
		libs="$R/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu"
		while read -r n; do
			[ -n "$n" ] || continue
			targets=""
			for d in /usr/sbin /usr/bin; do
				if [ -e "$N$d/$n" ] || [ -L "$N$d/$n" ]; then targets="$targets $d/$n"; fi
			done
			[ -n "$targets" ] || targets=/usr/sbin/$n
			xt=""
			case "$n" in *tables*) xt="XTABLES_LIBDIR=$R/usr/lib/x86_64-linux-gnu/xtables " ;; esac
			for t in $targets; do
				rm -f "$N$t"
				printf '#!/bin/sh\n%sexec %s --library-path %s %s "$@"\n' "$xt" "$ldso" "$libs" "$R/.npa-argv0/$n" >"$N$t"
				chmod 0755 "$N$t"
			done
		done <"$N$R/.npa-tools"
	fi
	mark "stage 1: mounted"
	exec switch_root $N /bin/bash "$proj/scripts/vm-init.sh" stage2 "$run"
	fail "switch_root failed"
fi

# ---- stage 2: bash on the host's root (overlay) ----
run="$2"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
poweroff_now() {
	echo o >/proc/sysrq-trigger
	sleep 30
}
# shellcheck disable=SC1090,SC1091
. "$run/env.sh" || { echo "vm-init: no $run/env.sh" >/dev/console; poweroff_now; }
export CARGO_NET_OFFLINE=true

# The console ports carrying COMMAND's stdout and stderr.
out=/dev/console
err=/dev/console
for p in /sys/class/virtio-ports/*; do
	[ -e "$p/name" ] || continue
	case "$(<"$p/name")" in
	npa.stdout) out="/dev/${p##*/}" ;;
	npa.stderr) err="/dev/${p##*/}" ;;
	esac
done

read -r up _ </proc/uptime
echo "$up" >"$NPA_VM_RUN/boot-seconds"
case " $(</proc/cmdline) " in *" npa_vm_debug=1 "*) echo "vm-init: $up stage 2: running COMMAND" >/dev/console ;; esac
cd "$NPA_VM_CWD" 2>/dev/null || cd "$NPA_VM_PROJ" || true
set +e
"${NPA_VM_CMD[@]}" </dev/null >"$out" 2>"$err"
rc=$?
echo "$rc" >"$NPA_VM_RUN/status"
cd /
poweroff_now
