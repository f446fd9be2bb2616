# The child subreaper of raygen/envs/subreaper.py, in Perl: same behaviour, a tenth of the start-up
# cost (about 2 ms of CPU with its keeper instead of 18), used where perl exists and the prctl syscall
# number is known.
# Usage: perl subreaper.pl PRCTL_SYSCALL_NUMBER ARGV...
# No `use strict; use warnings`: loading them doubles perl's start-up CPU (measured 1.5 -> 2.8 ms a
# command), paid for every command of every session. `perl -Mstrict -Mwarnings -c` passes on this file
# (tests/envs/test_subreaper.py checks it).

my $prctl = shift @ARGV;
pipe(my $status_r, my $status_w) or die "raygen subreaper: pipe: $!\n";
my $keeper = fork();
die "raygen subreaper: fork: $!\n" unless defined $keeper;
if ($keeper == 0) {
    close $status_r;
    # PR_SET_CHILD_SUBREAPER = 36: whatever the command detaches is re-parented here, not to init.
    syscall($prctl, 36, 1, 0, 0, 0) == 0 or print STDERR "raygen subreaper: prctl failed: $!\n";
    my $command = fork();
    die "raygen subreaper: fork: $!\n" unless defined $command;
    if ($command == 0) {
        close $status_w;
        exec { $ARGV[0] } @ARGV or exit 127;
    }
    # Hold none of the command's pipes: the worker stops reading once only background jobs hold them.
    open(STDIN, '<', '/dev/null');
    open(STDOUT, '>', '/dev/null');
    open(STDERR, '>', '/dev/null');
    while ((my $pid = waitpid(-1, 0)) > 0) {
        next unless $pid == $command;
        my $status = $?;
        # Anything left? Reap what already ended (1 is WNOHANG; `use POSIX` would double start-up CPU);
        # 0 means something still runs. "d": nothing left, this keeper ends at once and the front reaps
        # it; "b": background jobs remain, and it waits for them.
        my $left;
        while (($left = waitpid(-1, 1)) > 0) { }
        syswrite($status_w, ($left == 0 ? "b" : "d") . $status);
        close $status_w;
    }
    exit 0;    # nothing left: every descendant has ended
}
close $status_w;
my $status = '';
while (sysread($status_r, my $chunk, 64)) { $status .= $chunk; }
# A keeper with nothing left ends right after its message: reaped here. Left to init, it would be a
# zombie for as long as init takes to reap (seconds, on some machines), and its process group would
# look alive to the worker (kill 0 succeeds on a zombie): every session's cleanup would take the slow
# path. A keeper still waiting for background jobs is left alone: this process ends with the command.
waitpid($keeper, 0) if $status =~ s/^d//;
$status =~ s/^b//;
exit 137 if $status eq '';    # the keeper was killed before the command ended
if ($status & 127) {          # end the way the command ended, so the caller sees the signal
    my $signal = $status & 127;
    kill $signal, $$;
    exit 128 + $signal;
}
exit $status >> 8;
