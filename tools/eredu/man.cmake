# Writes eredu's man page with help2man (cmake -P tools/eredu/man.cmake, from tools/CMakeLists.txt):
# NAME, SYNOPSIS and OPTIONS from `eredu --help`, the sections of eredu.h2m, and a COMMANDS
# section holding each command's own `eredu COMMAND --help`, so the page says what the
# binary's help says and nothing else.
#   -DEREDU=<binary> -DHELP2MAN=<help2man> -DH2M=<eredu.h2m> -DNAME=<one line> -DOUT=<eredu.1>
execute_process(COMMAND ${EREDU} --help OUTPUT_VARIABLE top COMMAND_ERROR_IS_FATAL ANY)
# The commands: the lines "  <name>   <summary>" after "Subcommands:".
string(REGEX MATCH "Subcommands:\n(( +[a-z]+ [^\n]*\n)+)" _ "${top}")
string(REPLACE ";" "," listing "${CMAKE_MATCH_1}")
string(REPLACE "\n" ";" listing "${listing}")
set(commands)
foreach(line IN LISTS listing)
  if(line MATCHES "^ +([a-z]+) ")
    list(APPEND commands ${CMAKE_MATCH_1})
  endif()
endforeach()
if(NOT commands)
  message(FATAL_ERROR "man.cmake: no commands in the output of ${EREDU} --help")
endif()
set(section "[COMMANDS]\n")
foreach(command IN LISTS commands)
  execute_process(COMMAND ${EREDU} ${command} --help OUTPUT_VARIABLE help COMMAND_ERROR_IS_FATAL ANY)
  # roff: a backslash is \e; a line starting with . or ' would be a request.
  string(REPLACE "\\" "\\e" help "${help}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" help "${help}")
  string(APPEND section ".SS \"eredu ${command}\"\n.nf\n${help}.fi\n")
endforeach()
get_filename_component(dir ${OUT} DIRECTORY)
file(WRITE ${dir}/eredu-commands.h2m "${section}")
execute_process(COMMAND ${HELP2MAN} --no-info --section=1 --name=${NAME} --include=${H2M}
                        --include=${dir}/eredu-commands.h2m --output=${OUT} ${EREDU}
                COMMAND_ERROR_IS_FATAL ANY)
