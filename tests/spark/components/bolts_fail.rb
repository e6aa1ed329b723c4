# frozen_string_literal: true
#
# bolts_fail.rb - a Ruby BasicBolt that raises for every row whose value
# starts with "bad", with the value in the message ("cannot take row
# badxyz"), so no two rows' errors read the same; other rows are emitted
# upper-cased. For tests/spark/test_bolts_dataframe.py.

require_relative '../../../examples/ruby/multilang'

class FailBolt < Multilang::BasicBolt
  def process(tup)
    value = tup.values[0].to_s
    raise "cannot take row #{value}" if value.start_with?('bad')

    emit([value.upcase])
  end
end

FailBolt.run
