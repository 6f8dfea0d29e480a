#!/usr/bin/perl
# cu2cpp.pl IN OUT: rewrites the parts of a CUDA source that are not C++ so
# g++ compiles it against tests/cudacpu/include (docs/cuda.md):
#
#   k<<<grid, block, smem, stream>>>(args)
#       -> cudacpu::launch(k, "k", __FILE__, __LINE__, cudacpu::config(grid, block, smem, stream))(args)
#   extern __shared__ T name[];      -> T *name = (T *)cudacpu::dynamic_shared();
#   __shared__ T name[N];  (in a function)
#       -> static T name[N]; (registered, so each block starts with NaN in it)
#   #pragma unroll                   -> (dropped: g++ warns about it)
#   #include "x.cuh"                 -> #include "x.cuh.hpp" (rewritten the same way)
#   #include "other.h"               -> that file by its path beside IN
#
# Lines keep their numbers (and #line names IN), so compiler messages and
# the harness's reports point into the .cu file.
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Spec;

my ($in, $out) = @ARGV;
die "usage: cu2cpp.pl IN OUT\n" unless defined $out;
open(my $fh, '<', $in) or die "cu2cpp.pl: cannot read $in: $!\n";
my $src = do { local $/; <$fh> };
close $fh;
my $dir = File::Spec->rel2abs(dirname($in));

$src =~ s/^[ \t]*#[ \t]*pragma[ \t]+unroll\b[^\n]*//mg;

$src =~ s{^([ \t]*#[ \t]*include[ \t]+)"([^"]+)"}{
    my ($lead, $file) = ($1, $2);
    $file =~ /\.cuh$/ ? qq($lead"$file.hpp") : qq($lead"$dir/$file")
}mge;

# dynamic shared memory
$src =~ s{\bextern[ \t]+__shared__[ \t]+(?:__align__\(\d+\)[ \t]+)?([\w:]+(?:[ \t]+[\w:]+)*?)[ \t]+(\w+)[ \t]*\[[ \t]*\][ \t]*;}
         {$1 *$2 = ($1 *)cudacpu::dynamic_shared();}g;

# static shared memory: one declaration per line, inside a function
my $n = 0;
$src =~ s{^([ \t]+)__shared__[ \t]+([\w:]+(?:[ \t]+[\w:]+)*?)[ \t]+(\w+)((?:[ \t]*\[[^\]\n]*\])*)[ \t]*;}{
    $n++;
    "$1static $2 $3$4; static unsigned long cudacpu_generation_$n; "
      . "cudacpu::shared_static(&$3, sizeof $3, &cudacpu_generation_$n);"
}mge;
die "cu2cpp.pl: $in: a __shared__ declaration this script does not handle\n"
    if $src =~ /__shared__/;

# launches: the kernel is a name, optionally with template arguments
$src =~ s{\b([A-Za-z_]\w*(?:[ \t]*<[^<>;()]*>)?)[ \t]*<<<(.*?)>>>[ \t]*\(}{
    my ($kernel, $config) = ($1, $2);
    (my $name = $kernel) =~ s/"/\\"/g;
    qq(cudacpu::launch($kernel, "$name", __FILE__, __LINE__, cudacpu::config($config))\()
}sge;
die "cu2cpp.pl: $in: a kernel launch this script does not handle\n" if $src =~ /<<<|>>>/;

open(my $oh, '>', "$out.tmp") or die "cu2cpp.pl: cannot write $out: $!\n";
print $oh qq(#line 1 "$in"\n), $src;
close $oh or die "cu2cpp.pl: cannot write $out: $!\n";
rename("$out.tmp", $out) or die "cu2cpp.pl: cannot write $out: $!\n";
